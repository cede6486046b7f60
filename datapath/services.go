package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// Service is one captured Service address: TCP connections from enrolled
// pods to Addr are redirected to the pod's proxy.
type Service struct {
	Addr netip.AddrPort `json:"addr"`
	// FailOpen services stop being redirected when the proxy's heartbeat is
	// older than Config.HeartbeatMaxAge; the others (fail-closed) keep
	// being redirected, so the app sees a refused connection rather than a
	// plaintext bypass.
	FailOpen bool `json:"failOpen,omitempty"`
}

// ServicesFromSnapshot lists one Service per address and port of s's
// frontends. A frontend whose FailurePolicy is empty is fail-closed: the
// safe reading of an unset policy.
func ServicesFromSnapshot(s *snapshot.Snapshot) []Service {
	var out []Service
	for _, f := range s.Frontends {
		for _, a := range f.Addresses {
			out = append(out, Service{
				Addr:     netip.AddrPortFrom(a.Unmap(), f.Port),
				FailOpen: f.FailurePolicy == snapshot.FailOpen,
			})
		}
	}
	return out
}

// Apply makes the services map capture exactly s's frontends. Enrolment is
// separate (Enrol, SetEnrolments): mapping s.Workloads to network namespaces
// needs the node's /proc (see podns).
func (d *Datapath) Apply(s *snapshot.Snapshot) error {
	return d.SetServices(ServicesFromSnapshot(s))
}

// SetServices makes the services map hold exactly svcs. A Service present
// before and after is updated in place, so it is never missing in between;
// stale ones are deleted first, to make room in a full map for new ones.
func (d *Datapath) SetServices(svcs []Service) error {
	return d.reconcile("set services", func() error { return d.setServices(svcs) })
}

func (d *Datapath) setServices(svcs []Service) error {
	want := make(map[sockmeshSmServiceKey]sockmeshSmService, len(svcs))
	for _, s := range svcs {
		k, err := serviceKey(s.Addr)
		if err != nil {
			return fmt.Errorf("set services: %w", err)
		}
		var v sockmeshSmService
		if s.FailOpen {
			v.Flags = sockmeshSmServiceFlagsSM_SERVICE_FAIL_OPEN
		}
		want[k] = v
	}
	m := d.objs.SmServices
	var (
		k     sockmeshSmServiceKey
		v     sockmeshSmService
		stale []sockmeshSmServiceKey
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	for _, k := range stale {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete service %s: %w", keyAddr(k), err)
		}
	}
	for k, v := range want {
		if err := m.Update(&k, &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("set service %s: %w", keyAddr(k), err)
		}
	}
	return nil
}

// Services lists the services map.
func (d *Datapath) Services() ([]Service, error) {
	var (
		k   sockmeshSmServiceKey
		v   sockmeshSmService
		out []Service
	)
	it := d.objs.SmServices.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Service{Addr: keyAddr(k), FailOpen: v.Flags&sockmeshSmServiceFlagsSM_SERVICE_FAIL_OPEN != 0})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list services: %w", err)
	}
	return out, nil
}

func serviceKey(ap netip.AddrPort) (sockmeshSmServiceKey, error) {
	if !ap.IsValid() || ap.Port() == 0 {
		return sockmeshSmServiceKey{}, fmt.Errorf("invalid service address %s", ap)
	}
	return sockmeshSmServiceKey{
		Addr:  addrWords(ap.Addr()),
		Port:  htons(ap.Port()),
		Proto: unix.IPPROTO_TCP,
	}, nil
}

func keyAddr(k sockmeshSmServiceKey) netip.AddrPort {
	return netip.AddrPortFrom(wordsAddr(k.Addr), ntohs(k.Port))
}

// addrWords lays out an address as the programs store it: 16 bytes in
// network order, IPv4-mapped for IPv4, read as four native-endian words.
func addrWords(a netip.Addr) [4]uint32 {
	b := a.As16() // IPv4 becomes ::ffff:a.b.c.d
	var w [4]uint32
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func wordsAddr(w [4]uint32) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	return netip.AddrFrom16(b).Unmap()
}

// htons turns a port into the native-endian value of its network-order
// bytes, as the programs compare it.
func htons(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func ntohs(p uint16) uint16 { return htons(p) } // a byte swap is its own inverse
