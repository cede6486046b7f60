package sandbox

import (
	"errors"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sockmesh/sockmesh/internal/testenv"
)

// Veth is a veth pair between two test namespaces: interface A lives in the
// first, B in the second.
type Veth struct {
	A, B string
}

// NewVeth connects a and b with a veth pair, puts addrsA on a's end and
// addrsB on b's end and brings both up. Deleting one end deletes the pair;
// cleanup does so when t ends.
func NewVeth(t TB, a, b *NetNS, addrsA, addrsB []netip.Prefix) *Veth {
	t.Helper()
	testenv.RequireRoot(t)
	v := &Veth{A: Name(), B: Name()}
	t.Cleanup(func() {
		err := a.Do(func() error {
			l, err := netlink.LinkByName(v.A)
			if err != nil {
				var notFound netlink.LinkNotFoundError
				if errors.As(err, &notFound) {
					return nil
				}
				return err
			}
			return netlink.LinkDel(l)
		})
		if err != nil {
			t.Errorf("delete veth %s: %v", v.A, err)
		}
	})
	a.do(t, func() error {
		return netlink.LinkAdd(&netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: v.A},
			PeerName:      v.B,
			PeerNamespace: netlink.NsFd(b.Fd()),
		})
	})
	setUp := func(ns *NetNS, dev string, addrs []netip.Prefix) {
		ns.do(t, func() error {
			for _, p := range addrs {
				if err := addAddr(dev, p); err != nil {
					return err
				}
			}
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		})
	}
	setUp(a, v.A, addrsA)
	setUp(b, v.B, addrsB)
	waitOperUp(t, a, v.A)
	waitOperUp(t, b, v.B)
	return v
}

// waitOperUp waits until dev reports operational state up. The kernel
// applies carrier changes from a delayed work item (linkwatch, up to a
// second), and until then IPv6 on the interface has not joined its
// solicited-node groups: the first neighbour solicitation goes unanswered
// and the first connection stalls for a second.
func waitOperUp(t TB, ns *NetNS, dev string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var state netlink.LinkOperState
		ns.do(t, func() error {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return err
			}
			state = l.Attrs().OperState
			return nil
		})
		if state == netlink.OperUp {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("veth %s still %s after 10s", dev, state)
		}
		time.Sleep(time.Millisecond)
	}
}
