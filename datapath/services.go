package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"

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
	// Of is the Kubernetes Service the address belongs to: SetServices
	// captures all the addresses that share one, or none of them. The zero
	// ObjectRef joins nothing: such an address stands alone. The services
	// map does not hold it, so Services leaves it zero.
	Of snapshot.ObjectRef `json:"-"`
}

// ServicesFromSnapshot lists one Service per address and port of s's
// frontends, each naming its Kubernetes Service (Of). A frontend whose
// FailurePolicy is empty is fail-closed: the safe reading of an unset
// policy.
func ServicesFromSnapshot(s *snapshot.Snapshot) []Service {
	var out []Service
	for _, f := range s.Frontends {
		for _, a := range f.Addresses {
			out = append(out, Service{
				Addr:     netip.AddrPortFrom(a.Unmap(), f.Port),
				FailOpen: f.FailurePolicy == snapshot.FailOpen,
				Of:       f.Service,
			})
		}
	}
	return out
}

// Apply makes the services map capture s's frontends, each Service whole
// or not at all (SetServices). Enrolment is separate (Enrol,
// SetEnrolments): mapping s.Workloads to network namespaces needs the
// node's /proc (see podns).
func (d *Datapath) Apply(s *snapshot.Snapshot) error {
	return d.SetServices(ServicesFromSnapshot(s))
}

// SetServices makes the services map hold exactly svcs. A Service present
// before and after is updated in place, so it is never missing in between;
// stale ones are deleted first, to make room in a full map for new ones.
//
// When the map cannot hold them all, it holds every Kubernetes Service
// (Service.Of) it already held whole and, in the order of svcs, the others
// that fit whole; each left out has none of its addresses captured (any it
// had are deleted), and the error, which wraps ErrServicesLeftOut, names
// them. A Service captured for one address and not another would send,
// say, its IPv4 connections through the proxy and its IPv6 ones plaintext
// to the backend.
func (d *Datapath) SetServices(svcs []Service) error {
	return d.reconcile("set services", func() error { return d.setServices(svcs) })
}

func (d *Datapath) setServices(svcs []Service) error {
	groups, want, err := groupServices(svcs)
	if err != nil {
		return fmt.Errorf("set services: %w", err)
	}
	m := d.objs.SmServices
	var (
		k     sockmeshSmServiceKey
		v     sockmeshSmService
		stale []sockmeshSmServiceKey
		held  = make(map[sockmeshSmServiceKey]bool)
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if _, ok := want[k]; ok {
			held[k] = true
		} else {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	if err := deleteServices(m, stale); err != nil {
		return err
	}

	// Decide before writing: a Service held whole stays; another takes
	// room for the addresses it lacks, or gives back those it has.
	room := int(m.MaxEntries()) - len(held)
	var (
		fits []serviceGroup
		left []string
		drop []sockmeshSmServiceKey
	)
	for _, g := range groups {
		lacking := 0
		for _, k := range g.keys {
			if !held[k] {
				lacking++
			}
		}
		if lacking <= room {
			room -= lacking
			g.whole = lacking == 0
			fits = append(fits, g)
			continue
		}
		left = append(left, g.name)
		for _, k := range g.keys {
			if held[k] {
				drop = append(drop, k)
				room++
			}
		}
	}
	if err := deleteServices(m, drop); err != nil {
		return err
	}
	for _, g := range fits {
		for _, k := range g.keys {
			v := want[k]
			if err := m.Update(&k, &v, ebpf.UpdateAny); err != nil {
				err = fmt.Errorf("set service %s of %s: %w", keyAddr(k), g.name, err)
				// Only a Service held whole before (a flag's update)
				// may stay; another may not stay in part.
				if !g.whole {
					err = errors.Join(err, deleteServices(m, g.keys))
				}
				return err
			}
		}
	}
	if len(left) > 0 {
		return &servicesFullError{maxEntries: int(m.MaxEntries()), left: left}
	}
	return nil
}

// serviceGroup is the addresses of one Kubernetes Service (or one address
// without Service.Of), captured together or not at all.
type serviceGroup struct {
	name string
	keys []sockmeshSmServiceKey
	// whole: the map held every key before this write.
	whole bool
}

// groupServices groups svcs by Service.Of, in the order each Service first
// appears, and returns the value each address's key must have.
func groupServices(svcs []Service) ([]serviceGroup, map[sockmeshSmServiceKey]sockmeshSmService, error) {
	var (
		groups []serviceGroup
		byName = make(map[string]int) // index in groups
		want   = make(map[sockmeshSmServiceKey]sockmeshSmService, len(svcs))
		owner  = make(map[sockmeshSmServiceKey]string, len(svcs))
	)
	for _, s := range svcs {
		k, err := serviceKey(s.Addr)
		if err != nil {
			return nil, nil, err
		}
		name := s.Addr.String() // an address alone is its own group
		if s.Of != (snapshot.ObjectRef{}) {
			name = s.Of.String()
		}
		if o, ok := owner[k]; ok {
			if o != name {
				// The Snapshot never claims an address twice; a group
				// holding another's address could drop it (left out).
				return nil, nil, fmt.Errorf("service address %s listed for both %s and %s", s.Addr, o, name)
			}
		} else {
			owner[k] = name
			i, ok := byName[name]
			if !ok {
				i = len(groups)
				groups = append(groups, serviceGroup{name: name})
				byName[name] = i
			}
			groups[i].keys = append(groups[i].keys, k)
		}
		var v sockmeshSmService
		if s.FailOpen {
			v.Flags = sockmeshSmServiceFlagsSM_SERVICE_FAIL_OPEN
		}
		want[k] = v
	}
	return groups, want, nil
}

// deleteServices deletes keys from the services map; one missing already
// is no error.
func deleteServices(m *ebpf.Map, keys []sockmeshSmServiceKey) error {
	for _, k := range keys {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete service %s: %w", keyAddr(k), err)
		}
	}
	return nil
}

// servicesFullError names the Services SetServices left out whole because
// the services map had no room for all their addresses
// (ErrServicesLeftOut).
type servicesFullError struct {
	maxEntries int
	left       []string
}

func (e *servicesFullError) Error() string {
	const named = 5 // a thousand names would drown the log line
	names := strings.Join(e.left[:min(len(e.left), named)], ", ")
	if len(e.left) > named {
		names += fmt.Sprintf(" and %d more", len(e.left)-named)
	}
	return fmt.Sprintf("services map full (%d addresses): %v, none of their addresses captured: %s",
		e.maxEntries, ErrServicesLeftOut, names)
}

func (e *servicesFullError) Unwrap() error { return ErrServicesLeftOut }

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
