package enrol

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath/podns"
)

// ErrClosed is returned by Workload and Adopt once Close has run.
var ErrClosed = errors.New("enrol: closed")

// Workload returns the last Snapshot's workload for pod (of uid, unless uid
// is empty), enrolled or not, waiting for a Snapshot that lists it until
// ctx ends: the CNI plugin hands a pod's namespace over while its sandbox
// is made, which may be before the agent's informers saw the pod.
func (e *Enroller) Workload(ctx context.Context, pod snapshot.ObjectRef, uid string) (snapshot.Workload, error) {
	for {
		e.mu.Lock()
		w, ok := e.listedAs(pod, uid)
		changed, closed := e.listedChanged, e.closed
		e.mu.Unlock()
		switch {
		case closed:
			return snapshot.Workload{}, ErrClosed
		case ok:
			return w, nil
		}
		select {
		case <-ctx.Done():
			return snapshot.Workload{}, fmt.Errorf("wait for pod %s (uid %q) in the agent's Snapshot: %w", pod, uid, context.Cause(ctx))
		case <-changed:
		}
	}
}

// Adopt enrols w's pod in the network namespace ns at once, before
// the Snapshot knows the pod's address: the CNI plugin hands it over while
// the pod's sandbox (of ID sandbox) is made, so that none of its
// containers runs uncaptured. w.IPs are the addresses the CNI plugins gave
// the pod; the namespace must hold one of them. The pod stays enrolled
// there until a Snapshot lists it with an address (the same, it is the
// Snapshot's pod from then on; another, an older sandbox's, it waits), or
// with an address and not enrolled, or no longer lists it; meanwhile
// Config.Handovers holds a record of it, for the next agent. It returns
// once the enrolment map holds the namespace's cookie. Adopt takes ns over
// (and closes it when it fails). Deciding whether the pod is enrolled is
// the caller's (translate's rule).
func (e *Enroller) Adopt(w snapshot.Workload, ns *podns.NS, sandbox string) error {
	ino, err := holding(ns, w.IPs)
	if err != nil {
		ns.Close()
		return fmt.Errorf("adopt pod %s: %w", w.Pod, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		ns.Close()
		return ErrClosed
	}
	k := podKey{w.Pod, w.UID}
	p := &pod{w: w, ino: ino, state: Enrolled, since: time.Now(), handedOver: true, sandbox: sandbox}
	old, hadOld := e.pods[k]
	if _, ok := e.netns[ino]; ok {
		ns.Close() // held already (a repeated ADD, or a pod sharing it)
		if hadOld && old.state == Enrolled && old.ino == ino {
			return e.adopted(k, ino) // the kubelet retried an ADD that timed out
		}
	} else {
		n, err := e.open(ns, listenerPodOf(p))
		if err != nil {
			ns.Close()
			return fmt.Errorf("adopt pod %s: %w", w.Pod, err)
		}
		e.netns[ino] = n
	}
	// Recorded before the enrolment map is written: an agent starting
	// meanwhile writes it with this pod too.
	if err := e.writeRecord(p); err != nil {
		e.log.Warn("cannot record the handover: an agent that replaces this one drops the pod until the API server has its address",
			"pod", w.Pod.String(), "err", err)
	}
	if hadOld {
		if old.state == Enrolled {
			p.since = old.since
		}
		if old.sandbox != sandbox {
			e.forget(old) // an older sandbox's
		}
	}
	e.pods[k] = p
	n := e.netns[ino]
	e.log.Info("pod enrolled", "pod", w.Pod.String(), "netns", n.ns.Path(), "netns_cookie", n.cookie,
		"proxy_v4", addrString(n.proxy.V4), "proxy_v6", addrString(n.proxy.V6), "reason", "handed over by the CNI plugin")
	err = e.reconcile(false)
	e.scheduleRetry()
	if err != nil {
		return fmt.Errorf("adopt pod %s: %w", w.Pod, err)
	}
	return e.adopted(k, ino)
}

// adopted reports whether pod k is enrolled in namespace ino in the
// enrolment map. Called with e.mu held, after a reconcile.
func (e *Enroller) adopted(k podKey, ino uint64) error {
	p, ok := e.pods[k]
	switch {
	case !ok || p.state != Enrolled || p.ino != ino:
		return fmt.Errorf("adopt pod %s: released at once (the Snapshot lists it with an address, not enrolled)", k.ref)
	case e.unwritten:
		return fmt.Errorf("adopt pod %s: the enrolment map's last write failed", k.ref)
	}
	return nil
}

// holding checks that ns holds one of ips and returns its inode.
func holding(ns *podns.NS, ips []netip.Addr) (uint64, error) {
	if len(ips) == 0 {
		return 0, errors.New("no pod address was handed over (the CNI plugins before sockmesh's returned none)")
	}
	addrs, err := ns.Addrs()
	if err != nil {
		return 0, err
	}
	if !slices.ContainsFunc(ips, func(ip netip.Addr) bool { return slices.Contains(addrs, ip.Unmap()) }) {
		return 0, fmt.Errorf("the network namespace %s holds none of the pod's addresses %v", ns.Path(), ips)
	}
	return ns.Inode()
}

// keepHandedOver reports whether the handed-over pod p (key k) stays, given
// its workload w in the Snapshot's enrolled ones (inWant). The Snapshot
// takes the pod over once it has the address the CNI plugin gave it; it
// confirms the pod's sandbox once SandboxReady is set (until then a change
// of it is this sandbox's arrival, not a replacement). An address of
// another sandbox (an older, until the kubelet publishes the new) leaves
// the pod where the handover put it, while it is enrolled there or, taken
// over from another agent's record and not found yet, while the record is
// there and newer (its sandbox lives: see supersedes). Called with e.mu
// held.
func (e *Enroller) keepHandedOver(k podKey, p *pod, w snapshot.Workload, inWant bool) bool {
	if inWant {
		if !sameAddrs(w.IPs, p.w.IPs) {
			return p.state == Enrolled || p.carried != nil && e.recordNewer(p.sandbox, w)
		}
		p.w, p.handedOver = w, w.SandboxReady.IsZero()
		return true
	}
	l, ok := e.listedAs(k.ref, k.uid)
	return ok && len(l.IPs) == 0
}

// list records s's workloads and wakes Workload's waiters. Called with
// e.mu held.
func (e *Enroller) list(ws []snapshot.Workload) {
	e.listed = make(map[snapshot.ObjectRef]snapshot.Workload, len(ws))
	for _, w := range ws {
		e.listed[w.Pod] = w
	}
	close(e.listedChanged)
	e.listedChanged = make(chan struct{})
}

// listedAs returns the last Snapshot's workload for pod, if it has uid
// (any, if uid is empty). Called with e.mu held.
func (e *Enroller) listedAs(pod snapshot.ObjectRef, uid string) (snapshot.Workload, bool) {
	w, ok := e.listed[pod]
	if !ok || uid != "" && w.UID != uid {
		return snapshot.Workload{}, false
	}
	return w, true
}

func sameAddrs(a, b []netip.Addr) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(ip netip.Addr) bool { return !slices.Contains(b, ip) })
}
