package datapath

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// PairCounters are the decisions the connect hooks took for one pair: an
// enrolled network namespace (an application pod) and one captured Service
// address. Only connects from an enrolled namespace to a captured address
// are counted per pair; the others are in Counters only. Pairs live in an
// LRU map of 16384 entries, so the oldest pairs of a busy node are
// forgotten, and a pair's counts start again when it comes back.
type PairCounters struct {
	NetNSCookie uint64              `json:"netnsCookie"`
	Service     netip.AddrPort      `json:"service"`
	Counts      map[Decision]uint64 `json:"counts"`
}

// PairCounter returns the decisions counted for connects from netns to svc;
// every count is 0 when the pair was never counted (or was forgotten).
func (d *Datapath) PairCounter(netns uint64, svc netip.AddrPort) (map[Decision]uint64, error) {
	sk, err := serviceKey(svc)
	if err != nil {
		return nil, fmt.Errorf("read pair counter: %w", err)
	}
	var v sockmeshSmPairCounts
	err = d.objs.SmPairCounters.Lookup(&sockmeshSmPairKey{NetnsCookie: netns, Svc: sk}, &v)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, fmt.Errorf("read pair counter netns %d to %s: %w", netns, svc, err)
	}
	return pairCounts(v), nil
}

// PairCounters lists every pair counted, by netns cookie and address.
func (d *Datapath) PairCounters() ([]PairCounters, error) {
	var (
		k   sockmeshSmPairKey
		v   sockmeshSmPairCounts
		out []PairCounters
	)
	it := d.objs.SmPairCounters.Iterate()
	for it.Next(&k, &v) {
		out = append(out, PairCounters{NetNSCookie: k.NetnsCookie, Service: keyAddr(k.Svc), Counts: pairCounts(v)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list pair counters: %w", err)
	}
	slices.SortFunc(out, func(a, b PairCounters) int {
		return cmp.Or(cmp.Compare(a.NetNSCookie, b.NetNSCookie), a.Service.Compare(b.Service))
	})
	return out, nil
}

func pairCounts(v sockmeshSmPairCounts) map[Decision]uint64 {
	out := make(map[Decision]uint64, numDecisions)
	for _, dec := range Decisions() {
		out[dec] = v.N[dec]
	}
	return out
}
