package apply

import (
	"fmt"
	"net/netip"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// cover returns the Snapshot the proxy serves while the datapath and the
// enrolments move from what served covers to next: next's frontends,
// backends and workloads, plus every frontend address and enrolled pod of
// served that next drops, as served had them, since the datapath and the
// enrolments may redirect connections to and from those until their own
// steps run. Where both have a frontend for an address or a backend,
// next's wins: a changed property applies at once, which is no gap.
//
// It returns next itself when next drops nothing, which is the common case
// and costs one lookup per address and pod; otherwise a copy in O(n log n).
// The copy keeps served's version: it holds more than next and is not
// next, and nothing that compares versions (the proxy's
// sockmesh_proxy_snapshot_version, its logs) may take it for next.
func cover(served, next *snapshot.Snapshot) (*snapshot.Snapshot, error) {
	var frontends []snapshot.Frontend
	for _, f := range served.Frontends {
		var gone []netip.Addr
		for _, a := range f.Addresses {
			if _, ok := next.Frontend(netip.AddrPortFrom(a, f.Port)); !ok {
				gone = append(gone, a)
			}
		}
		if len(gone) > 0 {
			// Another Service of next may have taken the other addresses.
			f.Addresses = gone
			frontends = append(frontends, f)
		}
	}
	nextPods := make(map[podKey]bool, len(next.Workloads))
	for _, w := range next.Workloads {
		if w.Enrolled {
			nextPods[keyOf(w)] = true
		}
	}
	kept := make(map[podKey]snapshot.Workload)
	for _, w := range served.Workloads {
		if w.Enrolled && !nextPods[keyOf(w)] {
			kept[keyOf(w)] = w
		}
	}
	if len(frontends) == 0 && len(kept) == 0 {
		return next, nil
	}

	frontends = append(frontends, next.Frontends...)
	backends := append([]snapshot.Backend(nil), next.Backends...)
	// A kept frontend's backend, and those its routes name, are in next
	// or in served.
	for _, b := range served.Backends {
		if _, ok := next.Backend(b.Ref); !ok {
			backends = append(backends, b)
		}
	}
	workloads := make([]snapshot.Workload, 0, len(next.Workloads)+len(kept))
	for _, w := range next.Workloads {
		if _, ok := kept[keyOf(w)]; !ok {
			workloads = append(workloads, w)
		}
	}
	for _, w := range kept {
		workloads = append(workloads, w)
	}
	s, err := snapshot.New(served.Version, frontends, backends, workloads)
	if err != nil {
		return nil, fmt.Errorf("cover snapshot %d with %d: %w", next.Version, served.Version, err)
	}
	return s, nil
}

// podKey tells pods apart: a pod recreated under its name is another one.
type podKey struct {
	pod snapshot.ObjectRef
	uid string
}

func keyOf(w snapshot.Workload) podKey { return podKey{w.Pod, w.UID} }
