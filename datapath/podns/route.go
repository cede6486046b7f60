package podns

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultRouteAddrs returns, IPv4 first, one address of the namespace per
// family that has a default route in the main table: the preferred source
// (ip route's src) of the family's lowest-metric default route, else the
// first global unicast address of that route's interface — as the kubelet
// picks a node IP, but for each family, as a dual-stack node has a node IP
// in each. It fails when no family has one.
func (n *NS) DefaultRouteAddrs() ([]netip.Addr, error) {
	var out []netip.Addr
	err := n.netlink(func(h *netlink.Handle) error {
		for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			ip, err := defaultRouteAddr(h, family)
			if err != nil {
				return err
			}
			if ip.IsValid() {
				out = append(out, ip)
			}
		}
		if len(out) == 0 {
			return errors.New("no default route with a global address")
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("find default route addresses in netns %s: %w", n.Path(), err)
	}
	return out, nil
}

// defaultRouteAddr is DefaultRouteAddrs' address of family; the zero Addr
// when it has none.
func defaultRouteAddr(h *netlink.Handle, family int) (netip.Addr, error) {
	// A nil Dst with RT_FILTER_DST matches the family's default (0/0).
	routes, err := retryDump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list default routes: %w", err)
	}
	if len(routes) == 0 {
		return netip.Addr{}, nil
	}
	r := slices.MinFunc(routes, func(a, b netlink.Route) int { return a.Priority - b.Priority })
	if src, ok := netip.AddrFromSlice(r.Src); ok {
		return src.Unmap(), nil
	}
	link := r.LinkIndex
	if link == 0 && len(r.MultiPath) > 0 {
		link = r.MultiPath[0].LinkIndex // a multipath route names its interfaces per hop
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) {
		return h.AddrList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: link}}, family)
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list addresses of interface %d: %w", link, err)
	}
	// An address still in (or failed) duplicate address detection cannot
	// be bound, and a deprecated one is on its way out.
	const unusable = unix.IFA_F_TENTATIVE | unix.IFA_F_DADFAILED | unix.IFA_F_DEPRECATED
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsGlobalUnicast() && a.Flags&unusable == 0 {
			return ip.Unmap(), nil
		}
	}
	return netip.Addr{}, nil
}

// retryDump asks again when the list changed during the dump.
func retryDump[T any](dump func() ([]T, error)) ([]T, error) {
	list, err := dump()
	for tries := 1; errors.Is(err, netlink.ErrDumpInterrupted) && tries < 5; tries++ {
		list, err = dump()
	}
	return list, err
}
