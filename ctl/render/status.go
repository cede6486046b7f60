package render

import (
	"fmt"
	"io"
	"strings"

	"github.com/sockmesh/sockmesh/agent/controlplane"
	"github.com/sockmesh/sockmesh/agent/introspect"
	kubesource "github.com/sockmesh/sockmesh/agent/source/kubernetes"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/datapath"
)

// NodeStatus is what sockmeshctl status says of one node: its agent's
// answer or, with --all-nodes, why there is none.
type NodeStatus struct {
	// Status is the agent's answer, its fields inline; nil without one.
	*introspect.Status
	// Node is the node asked about (the agent's own name for it, when
	// status asks the one agent its socket or --agent-address names).
	Node  string     `json:"node"`
	Agent AgentState `json:"agent"`
	// Pod is the node's agent pod, namespace/name, and PodState its phase
	// and readiness ("Running, not ready"), when status --all-nodes found
	// agent pods.
	Pod      string `json:"pod,omitempty"`
	PodState string `json:"podState,omitempty"`
	// Error says why the agent gave no answer (AgentNotAnswering).
	Error string `json:"error,omitempty"`
}

// AgentState says whether a node's agent answered.
type AgentState string

const (
	// AgentAnswered: Status holds the agent's answer.
	AgentAnswered AgentState = "Answered"
	// AgentNotScheduled: no agent pod is scheduled to the node (the
	// DaemonSet's nodeSelector, affinity or tolerations leave it out), so
	// it was not asked: not a failure.
	AgentNotScheduled AgentState = "NotScheduled"
	// AgentNotAnswering: the node's agent should answer and did not.
	AgentNotAnswering AgentState = "NotAnswering"
)

// Status writes one row per agent that answered, then the nodes whose
// agent did not, then each answer's details.
func Status(w io.Writer, nodes []NodeStatus) error {
	var sts []introspect.Status
	t := tw(w)
	row(t, "NODE", "READY", "MODE", "VERSION", "SNAPSHOT", "APPLIED", "HOOKS", "PINNED", "CONFLICTS", "SERVICES", "PODS", "PROXY CONNS", "KINDS", "WRITES", "WARNINGS")
	for _, n := range nodes {
		if n.Status == nil {
			continue
		}
		st := *n.Status
		sts = append(sts, st)
		attached, pinned := 0, 0
		for _, h := range st.Datapath.State.Hooks {
			if h.Attached {
				attached++
			}
			if h.LinkPinned && h.ProgramPinned {
				pinned++
			}
		}
		applied := "-"
		if !st.Snapshot.AppliedAt.IsZero() {
			applied = age(st.Time.Sub(st.Snapshot.AppliedAt)) + " ago"
		}
		conns := 0.0
		for _, n := range st.Proxy.ActiveConnections {
			conns += n
		}
		row(t, st.Node, yesNo(st.Ready), st.Mode, st.Version, fmt.Sprintf("v%d", st.Snapshot.Version), applied,
			fmt.Sprintf("%d/%d", attached, len(st.Datapath.State.Hooks)), fmt.Sprintf("%d/%d", pinned, len(st.Datapath.State.Hooks)),
			len(st.Datapath.Conflicts), st.Datapath.Services, podsSummary(st.Pods), fmt.Sprintf("%.0f", conns), kindsSummary(st.Kinds),
			writesSummary(st.Writes), st.EventsTotal)
	}
	if len(sts) == 0 {
		row(t, "-", "(no agent answered)")
	}
	if err := t.Flush(); err != nil {
		return err
	}
	if len(sts) < len(nodes) {
		fmt.Fprintln(w, "\nNodes without an answer:")
		t := tw(w)
		row(t, "  NODE", "AGENT", "POD", "WHY")
		for _, n := range nodes {
			switch n.Agent {
			case AgentNotScheduled:
				row(t, "  "+n.Node, "no agent scheduled", "-", "no agent pod: the DaemonSet does not run here, so it was not asked")
			case AgentNotAnswering:
				pod := "-"
				if n.Pod != "" {
					pod = fmt.Sprintf("%s (%s)", n.Pod, n.PodState)
				}
				row(t, "  "+n.Node, "not answering", pod, n.Error)
			}
		}
		t.Flush()
	}
	for _, st := range sts {
		statusDetails(w, st)
	}
	return nil
}

func podsSummary(p introspect.PodsStatus) string {
	s := fmt.Sprintf("%d enrolled", p.Enrolled)
	if p.Pending+p.Failed > 0 {
		s += fmt.Sprintf(", %d pending, %d failed", p.Pending, p.Failed)
	}
	return s
}

// kindsSummary is how many optional kinds the agent watches, of those
// its source knows ("-": the file source, which has none).
func kindsSummary(kinds []kubesource.KindStatus) string {
	if len(kinds) == 0 {
		return "-"
	}
	watched := 0
	for _, k := range kinds {
		if k.Watched {
			watched++
		}
	}
	return fmt.Sprintf("%d/%d", watched, len(kinds))
}

// writesSummary says whether the agent writes status and generated
// Services (the leader) and how much it holds back ("-": the file source,
// which writes nothing).
func writesSummary(wr *controlplane.Writes) string {
	switch {
	case wr == nil:
		return "-"
	case !wr.Writing:
		return "no"
	}
	if n := heldCount(wr); n > 0 {
		return fmt.Sprintf("yes, %d held", n)
	}
	return "yes"
}

func heldCount(wr *controlplane.Writes) int {
	return len(wr.RBAC) + wr.RBACMore + len(wr.Backoff) + wr.BackoffMore
}

func statusDetails(w io.Writer, st introspect.Status) {
	fmt.Fprintf(w, "\nNode %s\n", st.Node)
	b := newBlock(w, 2)
	if st.Ready {
		b.add("Ready", "yes")
	} else {
		b.add("Ready", "no: %s", st.NotReady)
	}
	sn := st.Snapshot
	if sn.Version == 0 {
		b.add("Snapshot", "none applied yet")
	} else {
		b.add("Snapshot", "v%d applied %s ago: %d captured ports, %d backends (%d failing closed), %d pods",
			sn.Version, age(st.Time.Sub(sn.AppliedAt)), sn.Frontends, sn.Backends, sn.Invalid, sn.Workloads)
	}
	// Gauges holding whole numbers: %g would print v1.234567e+06 beside the
	// Snapshot's v1234567.
	b.add("Proxy", "serving v%.0f, active connections %s, endpoints ejected after failed connects %.0f", st.Proxy.SnapshotVersion,
		counts(st.Proxy.ActiveConnections, "%.0f"), st.Proxy.EjectedEndpoints)
	b.add("Pods", "%s; %d of the node's pods not enrolled by policy", podsSummary(st.Pods), st.Pods.NotEnrolled)
	b.add("Pin dir", "%s", orDash(st.Datapath.State.PinDir))
	b.add("Cgroup", "%s", orDash(st.Datapath.State.Cgroup))
	b.add("Datapath", "%d captured addresses, %d enrolled network namespaces", st.Datapath.Services, st.Datapath.Enrolments)
	b.add("Decisions", "%s", decisions(st.Datapath.Counters))
	if wr := st.Writes; wr != nil {
		switch {
		case !wr.Writing:
			b.add("Writes", "nothing: not the leader")
		case heldCount(wr) == 0:
			b.add("Writes", "status and generated Services, as the leader; nothing held back")
		default:
			b.add("Writes", "status and generated Services, as the leader; held back by RBAC: %d, in backoff: %d",
				len(wr.RBAC)+wr.RBACMore, len(wr.Backoff)+wr.BackoffMore)
		}
	}
	b.flush()

	fmt.Fprintln(w, "  Hooks:")
	t := tw(w)
	row(t, "    HOOK", "PROGRAM", "ID", "LINK", "ATTACHED", "PINNED")
	for _, h := range st.Datapath.State.Hooks {
		row(t, "    "+h.Name, h.ProgramName, h.ProgramID, h.LinkID, yesNo(h.Attached), pinState(h))
	}
	t.Flush()
	if len(st.Datapath.Conflicts) > 0 {
		fmt.Fprintln(w, "  Other programs on our hooks:")
		t := tw(w)
		row(t, "    HOOK", "PROGRAM", "ID", "ATTACHED AT", "RUNS")
		for _, c := range st.Datapath.Conflicts {
			at, runs := "Cgroup or above", "after ours"
			if c.Cgroup != "" {
				at = c.Cgroup
			}
			if c.RunsBeforeOurs {
				runs = "before ours"
				if c.Cgroup != "" {
					runs += " there" // for the processes in that cgroup only
				}
				if strings.HasPrefix(c.Hook, "connect") {
					runs += " (may rewrite Service addresses first)"
				}
			}
			row(t, "    "+c.Hook, orDash(c.Name), c.ProgramID, at, runs)
		}
		t.Flush()
	}
	if len(st.Kinds) > 0 {
		fmt.Fprintln(w, "  Optional kinds:")
		t := tw(w)
		row(t, "    KIND", "GROUP VERSION", "WATCHED", "WHY NOT")
		for _, k := range st.Kinds {
			why := k.Reason
			if k.Error != "" {
				why += ": " + k.Error
			}
			row(t, "    "+k.Kind, k.GroupVersion, yesNo(k.Watched), orDash(why))
		}
		t.Flush()
	}
	if wr := st.Writes; wr != nil && len(wr.RBAC) > 0 {
		fmt.Fprintln(w, "  Writes held back by RBAC:")
		t := tw(w)
		row(t, "    VERB", "RESOURCE", "NAMESPACE", "SINCE", "NEXT CHECK")
		for _, r := range wr.RBAC {
			row(t, "    "+r.Verb, r.GroupResource(), orDash(r.Namespace), age(st.Time.Sub(r.Since))+" ago", "in "+age(r.Recheck.Sub(st.Time)))
		}
		more(t, wr.RBACMore)
		t.Flush()
	}
	if wr := st.Writes; wr != nil && len(wr.Backoff) > 0 {
		fmt.Fprintln(w, "  Objects retried alone with backoff:")
		t := tw(w)
		row(t, "    RESOURCE", "OBJECT", "ATTEMPTS", "NEXT RETRY", "LAST ERROR")
		for _, o := range wr.Backoff {
			name := o.Name
			if o.Namespace != "" {
				name = o.Namespace + "/" + name
			}
			row(t, "    "+o.GroupResource(), name, o.Attempts, "in "+age(o.Retry.Sub(st.Time)), o.Error)
		}
		more(t, wr.BackoffMore)
		t.Flush()
	}
	translateFailures(w, "  ", st.TranslateFailures)
	if len(st.Pods.Unsettled) > 0 {
		fmt.Fprintln(w, "  Pods not enrolled yet:")
		t := tw(w)
		row(t, "    POD", "STATE", "SINCE", "REASON")
		for _, p := range st.Pods.Unsettled {
			row(t, "    "+p.Pod.String(), p.State, age(st.Time.Sub(p.Since))+" ago", p.Reason)
		}
		t.Flush()
	}
	if len(st.Datapath.Errors) > 0 {
		fmt.Fprintln(w, "  Datapath errors:")
		for _, e := range st.Datapath.Errors {
			fmt.Fprintf(w, "    %s\n", e)
		}
	}
	if len(st.Events) > 0 {
		fmt.Fprintf(w, "  Recent warnings and errors (%d since start):\n", st.EventsTotal)
		t := tw(w)
		row(t, "    AGE", "LEVEL", "COMPONENT", "MESSAGE")
		events := st.Events
		if len(events) > 10 {
			events = events[len(events)-10:]
		}
		for _, e := range events {
			msg := e.Message
			if err := e.Attrs["err"]; err != "" {
				msg += ": " + err
			}
			row(t, "    "+age(st.Time.Sub(e.Time)), e.Level, orDash(e.Component), msg)
		}
		t.Flush()
	}
}

// more writes how many entries a list the agent cut leaves out.
// translateFailures lists the objects whose translation panicked, each
// line led by indent: sockmeshctl status's, and describe's for what it
// describes.
func translateFailures(w io.Writer, indent string, failures []translate.Failure) {
	if len(failures) == 0 {
		return
	}
	fmt.Fprintln(w, indent+"Objects whose translation panicked (a bug: judged invalid, closed for what they govern; -o yaml has the stacks):")
	t := tw(w)
	row(t, indent+"  KIND", "OBJECT", "SERVICES", "PANIC")
	for _, f := range failures {
		services := make([]string, len(f.Services))
		for i, s := range f.Services {
			services[i] = s.String()
		}
		row(t, indent+"  "+f.Object.Kind, f.Object.Namespace+"/"+f.Object.Name, orDash(strings.Join(services, ", ")), f.Panic)
	}
	t.Flush()
}

func more(w io.Writer, n int) {
	if n > 0 {
		row(w, fmt.Sprintf("    ... and %d more", n))
	}
}

func pinState(h datapath.Hook) string {
	switch {
	case h.LinkPinned && h.ProgramPinned:
		return "yes"
	case h.LinkPinned:
		return "link only"
	case h.ProgramPinned:
		return "program only"
	}
	return "no"
}

func decisions(m map[datapath.Decision]uint64) string {
	s := map[string]uint64{}
	for d, n := range m {
		s[d.String()] = n
	}
	return counts(s, "%d")
}
