package introspect

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/datapath"
)

// Status is one agent's health at a glance: what sockmeshctl status shows.
type Status struct {
	Node    string    `json:"node"`
	Mode    string    `json:"mode"`
	Version string    `json:"version"`
	Time    time.Time `json:"time"`
	Ready   bool      `json:"ready"`
	// NotReady says why Ready is false.
	NotReady string         `json:"notReady,omitempty"`
	Snapshot SnapshotStatus `json:"snapshot"`
	Datapath DatapathStatus `json:"datapath"`
	Proxy    ProxyStatus    `json:"proxy"`
	Pods     PodsStatus     `json:"pods"`
	// Kinds are the optional kinds (Gateway API CRDs, ClusterTrustBundle,
	// ServiceCIDR) the kubernetes source watches or not, and why not;
	// none for the file source.
	Kinds []kubesource.KindStatus `json:"kinds,omitempty"`
	// Writes is what the agent's status and generated-Service writes hold
	// back, or that it writes nothing (not the leader); nil for the file
	// source, which writes nothing.
	Writes *controlplane.Writes `json:"writes,omitempty"`
	// TranslateFailures are the objects whose translation panicked (a
	// bug their data reached), each judged invalid and closed for what it
	// governs, with the panic and its stack for a bug report.
	TranslateFailures []translate.Failure `json:"translateFailures,omitempty"`
	// Events are the recent warnings and errors, oldest first;
	// EventsTotal counts every one since start.
	Events      []Event `json:"events,omitempty"`
	EventsTotal uint64  `json:"eventsTotal"`
}

// SnapshotStatus describes the Snapshot the data planes serve.
type SnapshotStatus struct {
	// Version is 0 before the first Snapshot is applied.
	Version   uint64    `json:"version"`
	AppliedAt time.Time `json:"appliedAt,omitzero"`
	Frontends int       `json:"frontends"`
	Backends  int       `json:"backends"`
	// Invalid counts backends that fail closed.
	Invalid   int `json:"invalid"`
	Workloads int `json:"workloads"`
}

// DatapathStatus is what the kernel holds.
type DatapathStatus struct {
	// State is the hooks (programs, links, attachment, pins) and maps.
	State datapath.State `json:"state"`
	// Conflicts are other programs on our hooks.
	Conflicts []datapath.Attached `json:"conflicts,omitempty"`
	// Services and Enrolments count the entries of those maps.
	Services   int `json:"services"`
	Enrolments int `json:"enrolments"`
	// Counters count TCP connects node-wide by decision.
	Counters map[datapath.Decision]uint64 `json:"counters,omitempty"`
	// Errors lists what could not be read.
	Errors []string `json:"errors,omitempty"`
}

// ProxyStatus is the proxy's load, read from its metrics.
type ProxyStatus struct {
	// ActiveConnections are the client connections being served, by path
	// (passthrough, l4, l4_tls, l7, http1).
	ActiveConnections map[string]float64 `json:"activeConnections,omitempty"`
	// SnapshotVersion is the version the proxy serves new connections with.
	SnapshotVersion float64 `json:"snapshotVersion"`
	// EjectedEndpoints are the endpoints the proxy passes over now because
	// their last connect failed (docs/design.md).
	EjectedEndpoints float64 `json:"ejectedEndpoints,omitempty"`
}

// PodsStatus counts the enrolled pods by state and lists those that are not
// Enrolled.
type PodsStatus struct {
	Enrolled int `json:"enrolled"`
	Pending  int `json:"pending"`
	Failed   int `json:"failed"`
	// NotEnrolled counts the node's pods the Snapshot does not enrol.
	NotEnrolled int         `json:"notEnrolled"`
	Unsettled   []enrol.Pod `json:"unsettled,omitempty"`
}

// Status reads every source now; parts that cannot be read are named in
// Datapath.Errors.
func (s *Sources) Status() Status {
	r := s.Report()
	st := Status{Node: r.Node, Mode: r.Mode, Version: r.Version, Time: r.Time, Ready: r.Ready, NotReady: r.NotReady,
		Events: r.Events, EventsTotal: r.EventsTotal}
	if r.Snapshot != nil {
		st.Snapshot = SnapshotStatus{Version: r.Snapshot.Version, AppliedAt: r.AppliedAt,
			Frontends: len(r.Snapshot.Frontends), Backends: len(r.Snapshot.Backends), Workloads: len(r.Snapshot.Workloads)}
		for _, b := range r.Snapshot.Backends {
			if b.Invalid != nil {
				st.Snapshot.Invalid++
			}
		}
		for _, w := range r.Snapshot.Workloads {
			if !w.Enrolled {
				st.Pods.NotEnrolled++
			}
		}
	}
	for _, p := range r.Pods {
		switch p.State {
		case enrol.Enrolled:
			st.Pods.Enrolled++
			continue
		case enrol.Pending:
			st.Pods.Pending++
		case enrol.Failed:
			st.Pods.Failed++
		}
		st.Pods.Unsettled = append(st.Pods.Unsettled, p)
	}
	st.Datapath = DatapathStatus{Conflicts: r.Datapath.Conflicts, Services: len(r.Datapath.Services),
		Enrolments: len(r.Datapath.Enrolments), Errors: r.Datapath.Errors}
	if r.Datapath.Counters != nil {
		st.Datapath.Counters = map[datapath.Decision]uint64{}
		for _, d := range datapath.Decisions() {
			st.Datapath.Counters[d] = r.Datapath.Counters[d.String()]
		}
	}
	if s.Datapath != nil {
		state, err := s.Datapath.State()
		st.Datapath.State = state
		if err != nil {
			st.Datapath.Errors = append(st.Datapath.Errors, err.Error())
		}
	}
	// Empty lists, not null, where there is no datapath or its hooks or
	// maps could not be read: clients iterate over them (jq's .hooks[]
	// fails on null).
	if st.Datapath.State.Hooks == nil {
		st.Datapath.State.Hooks = []datapath.Hook{}
	}
	if st.Datapath.State.Maps == nil {
		st.Datapath.State.Maps = []datapath.Map{}
	}
	if s.Metrics != nil {
		families, _ := s.Metrics.Gather() // a failing collector leaves its part out
		st.Proxy = proxyStatus(families)
	}
	if s.Kinds != nil {
		st.Kinds = s.Kinds()
	}
	if s.Writes != nil {
		st.Writes = s.Writes()
	}
	st.TranslateFailures = s.failures()
	return st
}

func (s *Sources) failures() []translate.Failure {
	if s.Failures == nil {
		return nil
	}
	return s.Failures()
}

func proxyStatus(families []*dto.MetricFamily) ProxyStatus {
	var p ProxyStatus
	for _, mf := range families {
		switch mf.GetName() {
		case "sockmesh_proxy_active_connections":
			p.ActiveConnections = map[string]float64{}
			for _, m := range mf.GetMetric() {
				p.ActiveConnections[label(m, "path")] += m.GetGauge().GetValue()
			}
		case "sockmesh_proxy_snapshot_version":
			for _, m := range mf.GetMetric() {
				p.SnapshotVersion = m.GetGauge().GetValue()
			}
		case "sockmesh_proxy_upstream_endpoints_ejected":
			for _, m := range mf.GetMetric() {
				p.EjectedEndpoints = m.GetGauge().GetValue()
			}
		}
	}
	return p
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Counters are the datapath's decision counters: node-wide, and per pod
// and captured Service address.
type Counters struct {
	Decisions map[datapath.Decision]uint64 `json:"decisions"`
	Pairs     []PairCounters               `json:"pairs,omitempty"`
}

// PairCounters are one pair's decisions, with the pod and Service named
// where this agent knows them.
type PairCounters struct {
	Pod         *snapshot.ObjectRef          `json:"pod,omitempty"`
	NetNSCookie uint64                       `json:"netnsCookie"`
	Service     *snapshot.ObjectRef          `json:"service,omitempty"`
	Addr        netip.AddrPort               `json:"addr"`
	Counts      map[datapath.Decision]uint64 `json:"counts"`
}

// Counters reads the datapath's counters now.
func (s *Sources) Counters() (Counters, error) {
	var c Counters
	if s.Datapath == nil {
		return c, errNoDatapath
	}
	var err error
	if c.Decisions, err = s.Datapath.Counters(); err != nil {
		return c, err
	}
	pairs, err := s.Datapath.PairCounters()
	if err != nil {
		return c, err
	}
	pods := map[uint64]snapshot.ObjectRef{}
	if s.Pods != nil {
		for _, p := range s.Pods() {
			if p.State == enrol.Enrolled {
				pods[p.NetNSCookie] = p.Pod
			}
		}
	}
	snap := s.snapshot()
	for _, p := range pairs {
		pc := PairCounters{NetNSCookie: p.NetNSCookie, Addr: p.Service, Counts: p.Counts}
		if ref, ok := pods[p.NetNSCookie]; ok {
			pc.Pod = &ref
		}
		if f, ok := snap.Frontend(p.Service); ok {
			svc := f.Service
			pc.Service = &svc
		}
		c.Pairs = append(c.Pairs, pc)
	}
	slices.SortStableFunc(c.Pairs, func(a, b PairCounters) int {
		return cmp.Or(cmp.Compare(refString(a.Pod), refString(b.Pod)), a.Addr.Compare(b.Addr))
	})
	return c, nil
}

func refString(r *snapshot.ObjectRef) string {
	if r == nil {
		return "~" // unknown pods last
	}
	return r.String()
}

// snapshot returns the applied Snapshot, or the empty one.
func (s *Sources) snapshot() *snapshot.Snapshot {
	if s.Applied != nil {
		if snap, _ := s.Applied(); snap != nil {
			return snap
		}
	}
	return snapshot.Empty()
}

// Explain answers q from this agent's state now.
func (s *Sources) Explain(q explain.Query) explain.Explanation {
	st := explain.State{Node: s.Node, Snapshot: s.snapshot()}
	if s.Pods != nil {
		st.Pods = s.Pods()
	}
	if s.Datapath != nil {
		st.Services, st.ServicesErr = s.Datapath.Services()
		st.Enrolments, st.EnrolmentsErr = s.Datapath.Enrolments()
		st.PairCounter = s.Datapath.PairCounter
	}
	e := explain.Explain(q, st)
	e.Notes = append(e.Notes, failureNotes(s.failures(), cmp.Or(e.Capture.Service, q.Service))...)
	return e
}

// failureNotes names the failures that concern connections to svc (nil:
// none known): an object whose translation panicked is judged invalid for
// a bug, not its data, which the explanation's own words (a route
// missing, a backend failing closed) do not tell.
func failureNotes(failures []translate.Failure, svc *snapshot.ObjectRef) []string {
	var notes []string
	for _, f := range failures {
		if svc == nil || !slices.Contains(f.Services, *svc) {
			continue
		}
		notes = append(notes, fmt.Sprintf("the translation of %s %s/%s panicked (internal error: %s): a bug in sockmesh, which judges it invalid, "+
			"closed for what it governs, until it changes or sockmesh is fixed; the agent's error log has the stack", f.Object.Kind, f.Object.Namespace, f.Object.Name, f.Panic))
	}
	return notes
}
