package explain

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/datapath"
)

// Query names a client pod and a destination. The destination is Addrs
// (an address the app dials; a Service's ClusterIPs) or a Service by name,
// on Port.
type Query struct {
	Pod snapshot.ObjectRef `json:"pod"`
	// Service names the destination Service, when known.
	Service *snapshot.ObjectRef `json:"service,omitempty"`
	Port    uint16              `json:"port"`
	Addrs   []netip.Addr        `json:"addrs,omitempty"`
}

// State is what one agent holds; the agent reads it for each Query.
type State struct {
	Node string
	// Snapshot is the one the data planes serve (nil before the first).
	Snapshot *snapshot.Snapshot
	// Pods is the enroller's view of the enrolled pods.
	Pods []enrol.Pod
	// Services and Enrolments are the datapath's maps; ServicesErr and
	// EnrolmentsErr say why one could not be read (it is nil then), so that
	// the answer does not claim the map lacks what it could not look at.
	Services      []datapath.Service
	ServicesErr   error
	Enrolments    map[uint64]datapath.Proxy
	EnrolmentsErr error
	// PairCounter reads the datapath's counters for one netns and
	// address; nil when the datapath cannot be read.
	PairCounter func(netns uint64, addr netip.AddrPort) (map[datapath.Decision]uint64, error)
}

// Verdict is what happens to the pod's connections to the destination.
type Verdict string

const (
	// Redirected: captured and sent to the proxy, which applies the
	// backend's properties.
	Redirected Verdict = "Redirected"
	// FailClosed: captured, but the backend's properties cannot be honoured:
	// the proxy answers 503 (HTTP) or resets the connection, never sends
	// plaintext.
	FailClosed Verdict = "FailClosed"
	// NotCaptured: the destination has no backend properties; connections
	// go where the app sent them, untouched.
	NotCaptured Verdict = "NotCaptured"
	// NotEnrolled: the pod is not enrolled; its connections go untouched.
	NotEnrolled Verdict = "NotEnrolled"
	// UnknownPod: the pod is not one of this node's pods.
	UnknownPod Verdict = "UnknownPod"
)

// Explanation is the answer to a Query.
type Explanation struct {
	Node  string `json:"node"`
	Query Query  `json:"query"`
	// SnapshotVersion is the version the answer was read from.
	SnapshotVersion uint64  `json:"snapshotVersion"`
	Verdict         Verdict `json:"verdict"`
	// Summary is the verdict in one sentence.
	Summary   string    `json:"summary"`
	Enrolment Enrolment `json:"enrolment"`
	Capture   Capture   `json:"capture"`
	// Backend is where connections go when no route applies (nil when not
	// captured).
	Backend *Backend `json:"backend,omitempty"`
	// Routes is the GAMMA route set that applies to the pod, if any.
	Routes *Routes `json:"routes,omitempty"`
	// Counters are the datapath's decisions for this pod and the
	// destination's captured addresses.
	Counters Counters `json:"counters"`
	// Notes point at disagreements between the Snapshot and the datapath,
	// and at what an operator may check next.
	Notes []string `json:"notes,omitempty"`
}

// Enrolment is where the pod stands.
type Enrolment struct {
	Enrolled bool `json:"enrolled"`
	// Reason says why the pod is not enrolled.
	Reason string `json:"reason,omitempty"`
	// State is the enroller's state (Enrolled, Pending, Failed) for a pod
	// the Snapshot enrols.
	State       enrol.State    `json:"state,omitempty"`
	IPs         []netip.Addr   `json:"ips,omitempty"`
	NetNS       string         `json:"netns,omitempty"`
	NetNSCookie uint64         `json:"netnsCookie,omitempty"`
	Proxy       datapath.Proxy `json:"proxy,omitzero"`
}

// Capture says whether the destination is captured.
type Capture struct {
	Captured bool `json:"captured"`
	// Reason says why it is not.
	Reason        string                 `json:"reason,omitempty"`
	Service       *snapshot.ObjectRef    `json:"service,omitempty"`
	PortName      string                 `json:"portName,omitempty"`
	FailurePolicy snapshot.FailurePolicy `json:"failurePolicy,omitempty"`
	// Addrs are the captured addresses and whether the datapath holds
	// them.
	Addrs []CapturedAddr `json:"addrs,omitempty"`
}

// CapturedAddr is one captured Service address.
type CapturedAddr struct {
	Addr       netip.AddrPort `json:"addr"`
	InDatapath bool           `json:"inDatapath"`
	// Unread: the datapath's services map could not be read, so whether
	// it holds Addr is unknown (InDatapath is false).
	Unread bool `json:"unread,omitempty"`
}

// Routes is the route set the proxy matches the pod's requests against.
type Routes struct {
	Kind snapshot.RouteKind `json:"kind"`
	// Role is "producer" (routes in the Service's namespace) or "consumer"
	// (routes in the client's own namespace, which replace the producer's
	// for clients there); Namespace is the routes' namespace.
	Role      string `json:"role"`
	Namespace string `json:"namespace"`
	Rules     []Rule `json:"rules"`
	// Backends are the backends the rules lead to.
	Backends []Backend `json:"backends,omitempty"`
}

// Rule is one route rule and what it matches.
type Rule struct {
	Route   snapshot.ObjectRef `json:"route"`
	Index   int                `json:"index"`
	Name    string             `json:"name,omitempty"`
	Matches []string           `json:"matches,omitempty"`
	// Backends are "weight backend" pairs.
	Backends []string          `json:"backends,omitempty"`
	Invalid  *snapshot.Invalid `json:"invalid,omitempty"`
}

// Counters are decision counts by datapath.Decision label.
type Counters struct {
	// Decisions sums the counts over Addrs.
	Decisions map[datapath.Decision]uint64 `json:"decisions,omitempty"`
	// ByAddr has the counts of each captured address.
	ByAddr map[netip.AddrPort]map[datapath.Decision]uint64 `json:"byAddr,omitempty"`
	// Unavailable says why there are none (not enrolled, not captured,
	// a datapath error).
	Unavailable string `json:"unavailable,omitempty"`
}

// Explain answers q from st.
func Explain(q Query, st State) Explanation {
	snap := st.Snapshot
	if snap == nil {
		snap = snapshot.Empty()
	}
	e := Explanation{Node: st.Node, Query: q, SnapshotVersion: snap.Version}
	e.Enrolment = enrolment(q.Pod, snap, st, &e.Notes)
	fe := e.capture(q, snap, st)
	if fe != nil {
		if b, ok := snap.Backend(fe.Backend); ok {
			v := DescribeBackend(b)
			e.Backend = &v
		}
		e.Routes = routes(fe, q.Pod.Namespace, snap)
	}
	e.counters(st)
	known := slices.ContainsFunc(snap.Workloads, func(w snapshot.Workload) bool { return w.Pod == q.Pod })
	e.Verdict, e.Summary = e.verdict(known)
	return e
}

func enrolment(pod snapshot.ObjectRef, snap *snapshot.Snapshot, st State, notes *[]string) Enrolment {
	i := slices.IndexFunc(snap.Workloads, func(w snapshot.Workload) bool { return w.Pod == pod })
	if i < 0 {
		return Enrolment{Reason: fmt.Sprintf("pod %s is not one of node %s's pods in snapshot %d (another node's pod, or not created yet)",
			pod, st.Node, snap.Version)}
	}
	w := snap.Workloads[i]
	en := Enrolment{IPs: w.IPs}
	if !w.Enrolled {
		en.Reason = w.NotEnrolled
		if en.Reason == "" {
			en.Reason = "the snapshot does not enrol it"
		}
		return en
	}
	j := slices.IndexFunc(st.Pods, func(p enrol.Pod) bool { return p.Pod == pod })
	if j < 0 {
		en.Reason = "the snapshot enrols it, but the enroller has not taken it up yet"
		return en
	}
	p := st.Pods[j]
	en.State, en.NetNS, en.NetNSCookie, en.Proxy = p.State, p.NetNS, p.NetNSCookie, p.Proxy
	if p.State != enrol.Enrolled {
		en.Reason = fmt.Sprintf("its network namespace is %s: %s", strings.ToLower(string(p.State)), p.Reason)
		return en
	}
	en.Enrolled = true
	if st.EnrolmentsErr != nil {
		*notes = append(*notes, fmt.Sprintf("the datapath's enrolment map cannot be read (%v): whether capture is on for this pod is unknown (see sockmeshctl status)", st.EnrolmentsErr))
	} else if _, ok := st.Enrolments[p.NetNSCookie]; !ok && st.Enrolments != nil {
		*notes = append(*notes, fmt.Sprintf("the datapath's enrolment map lacks netns cookie %d: capture is off for this pod until the enroller writes it", p.NetNSCookie))
	}
	return en
}

// capture finds the captured Service port of the destination, if any.
func (e *Explanation) capture(q Query, snap *snapshot.Snapshot, st State) *snapshot.Frontend {
	var fe *snapshot.Frontend
	for _, a := range q.Addrs {
		if f, ok := snap.Frontend(netip.AddrPortFrom(a, q.Port)); ok {
			fe = f
			break
		}
	}
	if fe == nil && q.Service != nil {
		for i := range snap.Frontends {
			f := &snap.Frontends[i]
			if f.Service == *q.Service && f.Port == q.Port {
				fe = f
				break
			}
		}
	}
	if fe == nil {
		e.Capture.Reason = notCaptured(q)
		return nil
	}
	svc := fe.Service
	e.Capture = Capture{Captured: true, Service: &svc, PortName: fe.PortName, FailurePolicy: fe.FailurePolicy}
	if q.Service != nil && *q.Service != fe.Service {
		e.Notes = append(e.Notes, fmt.Sprintf("the address belongs to Service %s, not %s", fe.Service, q.Service))
	}
	inDP := map[netip.AddrPort]bool{}
	for _, s := range st.Services {
		inDP[s.Addr] = true
	}
	if st.ServicesErr != nil {
		e.Notes = append(e.Notes, fmt.Sprintf("the datapath's services map cannot be read (%v): whether it holds these addresses is unknown (see sockmeshctl status)", st.ServicesErr))
	}
	for _, a := range fe.Addresses {
		ap := netip.AddrPortFrom(a.Unmap(), fe.Port)
		e.Capture.Addrs = append(e.Capture.Addrs, CapturedAddr{Addr: ap, InDatapath: inDP[ap], Unread: st.ServicesErr != nil})
		if !inDP[ap] && st.ServicesErr == nil {
			e.Notes = append(e.Notes, fmt.Sprintf("the datapath's services map lacks %s: this snapshot is not applied there yet (see sockmeshctl status)", ap))
		}
	}
	return fe
}

func notCaptured(q Query) string {
	const properties = "BackendTLSPolicy, XBackend, mesh route (HTTPRoute/GRPCRoute with the Service as parent) " +
		"or appProtocol (kubernetes.io/h2c, kubernetes.io/ws, or kubernetes.io/wss with a BackendTLSPolicy)"
	switch {
	case q.Service != nil:
		return fmt.Sprintf("Service %s port %d is not captured: no %s gives it backend properties", q.Service, q.Port, properties)
	case len(q.Addrs) > 0:
		// An address alone may be no Service's at all (a pod's, an
		// external host's): the Snapshot holds captured ones only.
		var as []string
		for _, a := range q.Addrs {
			as = append(as, netip.AddrPortFrom(a, q.Port).String())
		}
		return strings.Join(as, ", ") + " is not captured: sockmesh captures a Service's ClusterIP and port only, when a " +
			properties + " gives them backend properties, and this is no such address"
	}
	return "no destination given"
}

func routes(fe *snapshot.Frontend, clientNS string, snap *snapshot.Snapshot) *Routes {
	if fe.Routes == nil {
		return nil
	}
	set, role, ns := fe.Routes.Producer, "producer", fe.Service.Namespace
	for i := range fe.Routes.Consumers {
		if c := &fe.Routes.Consumers[i]; c.Namespace == clientNS {
			set, role, ns = &c.Routes, "consumer", c.Namespace
		}
	}
	if set == nil {
		return nil
	}
	return DescribeRoutes(set, role, ns, snap)
}

// DescribeRoutes returns the operator's view of one route set of snap;
// role is "producer" or "consumer", namespace the routes' namespace.
func DescribeRoutes(set *snapshot.RouteSet, role, namespace string, snap *snapshot.Snapshot) *Routes {
	r := &Routes{Kind: set.Kind, Role: role, Namespace: namespace}
	matches := make([][]string, len(set.Rules))
	for _, m := range set.Matches {
		matches[m.Rule] = append(matches[m.Rule], describeMatch(m))
	}
	seen := map[snapshot.BackendRef]bool{}
	for i, rule := range set.Rules {
		out := Rule{Route: rule.Route, Index: rule.Index, Name: rule.Name, Matches: matches[i], Invalid: rule.Invalid}
		if rule.Redirect != nil {
			out.Backends = append(out.Backends, fmt.Sprintf("redirect %d", rule.Redirect.StatusCode))
		}
		for _, wb := range rule.Backends {
			if wb.Invalid != nil {
				out.Backends = append(out.Backends, fmt.Sprintf("%d invalid (%s: %s)", wb.Weight, wb.Invalid.Reason, wb.Invalid.Message))
				continue
			}
			out.Backends = append(out.Backends, fmt.Sprintf("%d %s", wb.Weight, wb.Backend))
			if b, ok := snap.Backend(wb.Backend); ok && !seen[wb.Backend] {
				seen[wb.Backend] = true
				r.Backends = append(r.Backends, DescribeBackend(b))
			}
		}
		r.Rules = append(r.Rules, out)
	}
	slices.SortFunc(r.Backends, func(a, b Backend) int { return cmp.Compare(a.Ref.String(), b.Ref.String()) })
	return r
}

func describeMatch(m snapshot.RouteMatch) string {
	parts := []string{fmt.Sprintf("path %s %s", m.Path.Type, m.Path.Value)}
	if m.Method != "" {
		parts = append(parts, "method "+m.Method)
	}
	for _, h := range m.Headers {
		parts = append(parts, fmt.Sprintf("header %s %s %s", h.Name, h.Type, h.Value))
	}
	for _, p := range m.QueryParams {
		parts = append(parts, fmt.Sprintf("query %s %s %s", p.Name, p.Type, p.Value))
	}
	return strings.Join(parts, ", ")
}

func (e *Explanation) counters(st State) {
	switch {
	case !e.Enrolment.Enrolled:
		e.Counters.Unavailable = "the pod is not enrolled: the datapath counts its connects per pair only once it is"
		return
	case !e.Capture.Captured:
		e.Counters.Unavailable = "the destination is not captured: the datapath counts it only node-wide (skipped_no_service)"
		return
	case st.PairCounter == nil:
		e.Counters.Unavailable = "the datapath cannot be read"
		return
	}
	e.Counters.Decisions = map[datapath.Decision]uint64{}
	e.Counters.ByAddr = map[netip.AddrPort]map[datapath.Decision]uint64{}
	for _, a := range e.Capture.Addrs {
		n, err := st.PairCounter(e.Enrolment.NetNSCookie, a.Addr)
		if err != nil {
			e.Counters.Unavailable = err.Error()
			continue
		}
		e.Counters.ByAddr[a.Addr] = n
		for d, v := range n {
			e.Counters.Decisions[d] += v
		}
	}
}

// verdict sums up; known says whether the pod is one of the node's.
func (e *Explanation) verdict(known bool) (Verdict, string) {
	pod := e.Query.Pod.String()
	switch {
	case !known:
		return UnknownPod, e.Enrolment.Reason
	case !e.Enrolment.Enrolled:
		return NotEnrolled, fmt.Sprintf("%s is not enrolled (%s): its connections go where it sends them, untouched", pod, e.Enrolment.Reason)
	case !e.Capture.Captured:
		return NotCaptured, "connections from " + pod + " go where they are sent, untouched: " + e.Capture.Reason
	}
	svc := e.Capture.Service.String()
	closed := "fail-closed: while the proxy is down, connects are refused"
	if e.Capture.FailurePolicy == snapshot.FailOpen {
		closed = "fail-open: while the proxy is down, connects go to the Service address directly"
	}
	if e.Backend != nil && e.Backend.Invalid != nil && e.Routes == nil {
		return FailClosed, fmt.Sprintf("connections from %s to %s are redirected to the proxy, which refuses them (HTTP 503 or a reset, never plaintext): %s %s: %s",
			pod, svc, e.Backend.Invalid.Policy, e.Backend.Invalid.Reason, e.Backend.Invalid.Message)
	}
	what := "the backend's properties"
	if e.Backend != nil {
		what = e.Backend.Wire
		if why := e.Backend.unreachable(); why != "" && e.Routes == nil {
			e.Notes = append(e.Notes, fmt.Sprintf("%s has %s: the proxy answers HTTP 503 or resets each connection (no_endpoints)", e.Backend.Ref, why))
		}
	}
	if e.Routes != nil {
		for _, b := range e.Routes.Backends {
			if b.Invalid != nil {
				e.Notes = append(e.Notes, fmt.Sprintf("requests routed to %s fail closed (HTTP 503): %s %s: %s",
					b.Ref, b.Invalid.Policy, b.Invalid.Reason, b.Invalid.Message))
			}
			if why := b.unreachable(); why != "" {
				e.Notes = append(e.Notes, fmt.Sprintf("requests routed to %s fail (HTTP 503, no_endpoints): it has %s", b.Ref, why))
			}
		}
		what = fmt.Sprintf("the %s %s routes (%d rules)", e.Routes.Role, e.Routes.Kind, len(e.Routes.Rules))
	}
	return Redirected, fmt.Sprintf("connections from %s to %s are redirected to the proxy, which applies %s; %s", pod, svc, what, closed)
}
