package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// Proxy is where an enrolled network namespace's captured connections go.
type Proxy struct {
	// NetNSCookie is the cookie of the netns the proxy's listeners are in:
	// the node's root netns in node-IP mode, the pod's own netns in in-pod
	// mode (podns.NS.Cookie gives either).
	NetNSCookie uint64 `json:"netnsCookie"`
	// V4 and V6 are the listener addresses per family; leave one zero when
	// the proxy has no listener in that family. A connection in a family
	// without listener passes untouched to a fail-open service and is
	// refused (EPERM from connect) for a fail-closed one.
	V4 netip.AddrPort `json:"v4,omitzero"`
	V6 netip.AddrPort `json:"v6,omitzero"`
}

// ErrLoopbackElsewhere is returned by Enrol for a loopback proxy address in
// another netns than the pod's: loopback only reaches the pod itself, so the
// in-pod listener must be in the pod's netns (DESIGN.md: never redirect to
// 127.0.0.1 unless an in-pod listener exists).
var ErrLoopbackElsewhere = errors.New("loopback proxy address outside the pod's netns")

// Enrol captures connections from the netns with cookie netns, sending them
// to p. Enrolling again replaces p. Enrol and Unenrol write the map at
// once, for tools and tests: unlike SetEnrolments they write even when a
// newer agent owns the datapath, and a take-back does not write them again
// (owner.go). An agent uses SetEnrolments.
func (d *Datapath) Enrol(netns uint64, p Proxy) error {
	v, err := proxyValue(netns, p)
	if err != nil {
		return fmt.Errorf("enrol netns %d: %w", netns, err)
	}
	if err := d.objs.SmNetns.Update(&netns, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("enrol netns %d: %w", netns, err)
	}
	return nil
}

// Unenrol stops capturing the netns; connections already redirected keep
// their proxy. Unenrolling a netns that is not enrolled is not an error.
func (d *Datapath) Unenrol(netns uint64) error {
	if err := d.objs.SmNetns.Delete(&netns); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unenrol netns %d: %w", netns, err)
	}
	return nil
}

// Enrolments lists the enrolled netns cookies and their proxies.
func (d *Datapath) Enrolments() (map[uint64]Proxy, error) {
	var (
		k   uint64
		v   sockmeshSmProxy
		out = make(map[uint64]Proxy)
	)
	it := d.objs.SmNetns.Iterate()
	for it.Next(&k, &v) {
		out[k] = proxyFromValue(v)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list enrolments: %w", err)
	}
	return out, nil
}

// SetEnrolments makes the enrolment map hold exactly want: it unenrols the
// netns cookies not in want first, to make room in a full map, then enrols
// (a netns enrolled before and after is updated in place, never missing).
func (d *Datapath) SetEnrolments(want map[uint64]Proxy) error {
	return d.reconcile("set enrolments", func() error { return d.setEnrolments(want) })
}

func (d *Datapath) setEnrolments(want map[uint64]Proxy) error {
	have, err := d.Enrolments()
	if err != nil {
		return err
	}
	for ns := range have {
		if _, ok := want[ns]; !ok {
			if err := d.Unenrol(ns); err != nil {
				return err
			}
		}
	}
	for ns, p := range want {
		if err := d.Enrol(ns, p); err != nil {
			return err
		}
	}
	return nil
}

func proxyValue(netns uint64, p Proxy) (sockmeshSmProxy, error) {
	v := sockmeshSmProxy{NetnsCookie: p.NetNSCookie}
	if p.NetNSCookie == 0 {
		return v, errors.New("proxy netns cookie is 0")
	}
	if !p.V4.IsValid() && !p.V6.IsValid() {
		return v, errors.New("proxy has no address")
	}
	for _, ap := range []netip.AddrPort{p.V4, p.V6} {
		if !ap.IsValid() {
			continue
		}
		a := ap.Addr().Unmap()
		if ap.Port() == 0 || a.IsUnspecified() {
			return v, fmt.Errorf("invalid proxy address %s", ap)
		}
		if a.IsLoopback() && p.NetNSCookie != netns {
			return v, fmt.Errorf("%s: %w", ap, ErrLoopbackElsewhere)
		}
	}
	if p.V4.IsValid() {
		a := p.V4.Addr().Unmap()
		if !a.Is4() {
			return v, fmt.Errorf("proxy V4 address %s is not IPv4", p.V4)
		}
		v.Addr4 = addrWords(a)[3]
		v.Port4 = htons(p.V4.Port())
	}
	if p.V6.IsValid() {
		if !p.V6.Addr().Is6() || p.V6.Addr().Is4In6() {
			return v, fmt.Errorf("proxy V6 address %s is not IPv6", p.V6)
		}
		v.Addr6 = addrWords(p.V6.Addr())
		v.Port6 = htons(p.V6.Port())
	}
	return v, nil
}

func proxyFromValue(v sockmeshSmProxy) Proxy {
	p := Proxy{NetNSCookie: v.NetnsCookie}
	if v.Port4 != 0 {
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], v.Addr4)
		p.V4 = netip.AddrPortFrom(netip.AddrFrom4(b), ntohs(v.Port4))
	}
	if v.Port6 != 0 {
		p.V6 = netip.AddrPortFrom(wordsAddr(v.Addr6), ntohs(v.Port6))
	}
	return p
}
