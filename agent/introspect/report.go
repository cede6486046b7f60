package introspect

import (
	"errors"
	"net/netip"
	"slices"
	"time"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/datapath"
)

// Datapath is the part of *datapath.Datapath the introspection reads.
type Datapath interface {
	Services() ([]datapath.Service, error)
	Enrolments() (map[uint64]datapath.Proxy, error)
	Counters() (map[datapath.Decision]uint64, error)
	Conflicts() ([]datapath.Attached, error)
	State() (datapath.State, error)
	PairCounter(netns uint64, addr netip.AddrPort) (map[datapath.Decision]uint64, error)
	PairCounters() ([]datapath.PairCounters, error)
}

// errNoDatapath answers requests for datapath state when Sources has none.
var errNoDatapath = errors.New("no datapath")

// Sources are where a Report comes from; the agent fills them once. A nil
// function or interface leaves its part of the Report empty.
type Sources struct {
	// Node is the node's name, Mode the proxy mode (node-ip, in-pod).
	Node, Mode string
	// Version is the agent's build version.
	Version string
	// Applied returns the Snapshot the data planes serve and when it was
	// applied (nil before the first).
	Applied func() (*snapshot.Snapshot, time.Time)
	// Pods returns the enroller's view of the node's pods.
	Pods func() []enrol.Pod
	// Ready returns why the agent is not ready, or nil.
	Ready    func() error
	Datapath Datapath
	Events   *Events
	// Metrics is the agent's registry: the proxy's load is read from it,
	// and the introspection API serves its metrics and their catalog.
	Metrics *Catalog
	// Kinds says which optional kinds the kubernetes source watches.
	Kinds func() []kubesource.KindStatus
	// Writes says what the control plane's writes hold back.
	Writes func() *controlplane.Writes
	// Failures are the objects whose translation panicked at the control
	// plane's last translation (controlplane's Failures).
	Failures func() []translate.Failure
}

// Report is a point-in-time view of one agent. It marshals to JSON and YAML
// (sigs.k8s.io/yaml) as it is.
type Report struct {
	Node    string    `json:"node"`
	Mode    string    `json:"mode"`
	Version string    `json:"version"`
	Time    time.Time `json:"time"`
	Ready   bool      `json:"ready"`
	// NotReady says why Ready is false.
	NotReady string `json:"notReady,omitempty"`
	// Snapshot is what the proxy and datapath serve; nil before the first.
	Snapshot  *snapshot.Snapshot `json:"snapshot,omitempty"`
	AppliedAt time.Time          `json:"appliedAt,omitzero"`
	Pods      []enrol.Pod        `json:"pods,omitempty"`
	Datapath  DatapathReport     `json:"datapath"`
	// Events are the recent warnings and errors, oldest first;
	// EventsTotal counts every one since start.
	Events      []Event `json:"events,omitempty"`
	EventsTotal uint64  `json:"eventsTotal"`
}

// DatapathReport is what the eBPF maps and hooks hold.
type DatapathReport struct {
	Services []datapath.Service `json:"services,omitempty"`
	// Enrolments are keyed by netns cookie.
	Enrolments map[uint64]datapath.Proxy `json:"enrolments,omitempty"`
	// Counters count TCP connects by decision label (redirected,
	// skipped_not_enrolled, ...).
	Counters  map[string]uint64   `json:"counters,omitempty"`
	Conflicts []datapath.Attached `json:"conflicts,omitempty"`
	// Errors lists what could not be read.
	Errors []string `json:"errors,omitempty"`
}

// Report reads every source now. Parts that cannot be read are reported in
// Datapath.Errors rather than failing the whole Report.
func (s *Sources) Report() Report {
	r := Report{Node: s.Node, Mode: s.Mode, Version: s.Version, Time: time.Now()}
	if s.Ready != nil {
		if err := s.Ready(); err != nil {
			r.NotReady = err.Error()
		} else {
			r.Ready = true
		}
	}
	if s.Applied != nil {
		snap, at := s.Applied()
		r.Snapshot, r.AppliedAt = redact(snap), at
	}
	if s.Pods != nil {
		r.Pods = s.Pods()
	}
	if s.Events != nil {
		r.Events, r.EventsTotal = s.Events.Recent()
	}
	if s.Datapath != nil {
		r.Datapath = readDatapath(s.Datapath)
	}
	return r
}

func readDatapath(dp Datapath) DatapathReport {
	var (
		out  DatapathReport
		errs []error
		err  error
	)
	out.Services, err = dp.Services()
	errs = append(errs, err)
	out.Enrolments, err = dp.Enrolments()
	errs = append(errs, err)
	counters, err := dp.Counters()
	errs = append(errs, err)
	if counters != nil {
		out.Counters = make(map[string]uint64, len(counters))
		for d, n := range counters {
			out.Counters[d.String()] = n
		}
	}
	out.Conflicts, err = dp.Conflicts()
	errs = append(errs, err)
	for _, e := range errs {
		if e != nil {
			out.Errors = append(out.Errors, e.Error())
		}
	}
	return out
}

// Snapshot returns the applied Snapshot, private keys redacted, and when it
// was applied; nil before the first.
func (s *Sources) Snapshot() (*snapshot.Snapshot, time.Time) {
	if s.Applied == nil {
		return nil, time.Time{}
	}
	snap, at := s.Applied()
	return redact(snap), at
}

// redacted replaces private keys in a Report.
const redacted = "<redacted>"

// redact returns s without private keys (XBackend client certificates'
// keys): a Report is for operators, who must not learn them from it. The
// copy is for marshalling only; its lookup methods find nothing.
func redact(s *snapshot.Snapshot) *snapshot.Snapshot {
	if s == nil {
		return nil
	}
	backends := slices.Clone(s.Backends)
	for i, b := range backends {
		if b.TLS != nil && b.TLS.ClientKeyPEM != "" {
			tls := *b.TLS
			tls.ClientKeyPEM = redacted
			backends[i].TLS = &tls
		}
	}
	return &snapshot.Snapshot{Version: s.Version, Frontends: s.Frontends, Backends: backends, Workloads: s.Workloads}
}
