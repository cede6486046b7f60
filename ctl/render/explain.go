package render

import (
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/ctl/describe"
	"github.com/sockmesh/sockmesh/datapath"
)

// Explained is sockmeshctl explain's answer: the agent's explanation and,
// when the API server was reachable, what the cluster says about the
// destination Service (policies and routes naming it, with their status).
type Explained struct {
	explain.Explanation
	Related *describe.Service `json:"related,omitempty"`
}

// Explain writes an explanation, kubectl describe style.
func Explain(w io.Writer, e Explained) error {
	q := e.Query
	b := newBlock(w, 0)
	b.add("Pod", "%s (node %s, snapshot v%d)", q.Pod, e.Node, e.SnapshotVersion)
	b.add("Destination", "%s", destination(q))
	b.add("Verdict", "%s", e.Verdict)
	b.add("", "%s", e.Summary)
	b.flush()

	fmt.Fprintln(w, "Enrolment:")
	b = newBlock(w, 2)
	en := e.Enrolment
	if en.Enrolled {
		b.add("Enrolled", "yes")
		b.add("Network namespace", "%s (cookie %d)", orDash(en.NetNS), en.NetNSCookie)
		b.add("Proxy", "%s", proxy(en.Proxy))
	} else {
		b.add("Enrolled", "no: %s", en.Reason)
	}
	if len(en.IPs) > 0 {
		b.add("Pod IPs", "%s", joinAddrs(en.IPs))
	}
	b.flush()

	fmt.Fprintln(w, "Capture:")
	b = newBlock(w, 2)
	c := e.Capture
	if !c.Captured {
		b.add("Captured", "no: %s", c.Reason)
	} else {
		port := fmt.Sprint(q.Port)
		if c.PortName != "" {
			port = fmt.Sprintf("%s (%d)", c.PortName, q.Port)
		}
		b.add("Captured", "yes: Service %s port %s", c.Service, port)
		var addrs []string
		for _, a := range c.Addrs {
			s := a.Addr.String()
			switch {
			case a.Unread:
				s += " (the datapath's map cannot be read)"
			case !a.InDatapath:
				s += " (NOT in the datapath)"
			}
			addrs = append(addrs, s)
		}
		b.add("Addresses", "%s", strings.Join(addrs, ", "))
		b.add("Failure policy", "%s", failurePolicy(c.FailurePolicy))
	}
	b.flush()

	if e.Backend != nil {
		fmt.Fprintln(w, "Backend:")
		backendBlock(w, 2, *e.Backend)
	}
	if r := e.Routes; r != nil {
		fmt.Fprintf(w, "Routes: %s %s set of namespace %s\n", r.Kind, r.Role, r.Namespace)
		routesTable(w, 2, r.Rules)
		for _, be := range r.Backends {
			fmt.Fprintf(w, "  Backend %s:\n", be.Ref)
			backendBlock(w, 4, be)
		}
	}

	fmt.Fprintln(w, "Counters:")
	b = newBlock(w, 2)
	if e.Counters.Unavailable != "" && e.Counters.Decisions == nil {
		b.add("Decisions", "none: %s", e.Counters.Unavailable)
	} else {
		b.add("Decisions", "%s", decisions(e.Counters.Decisions))
		for _, a := range slices.SortedFunc(maps.Keys(e.Counters.ByAddr), netip.AddrPort.Compare) {
			b.add(a.String(), "%s", decisions(e.Counters.ByAddr[a]))
		}
		// Some address's counters could not be read: its counts are not in
		// the sums above, which must not pass for complete.
		if e.Counters.Unavailable != "" {
			b.add("Not counted", "%s", e.Counters.Unavailable)
		}
	}
	b.flush()

	if len(e.Notes) > 0 {
		fmt.Fprintln(w, "Notes:")
		for _, n := range e.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
	}
	if e.Related != nil {
		related(w, e.Related)
	}
	return nil
}

func destination(q explain.Query) string {
	var parts []string
	if q.Service != nil {
		parts = append(parts, fmt.Sprintf("Service %s port %d", q.Service, q.Port))
	}
	if len(q.Addrs) > 0 {
		var as []string
		for _, a := range q.Addrs {
			as = append(as, netip.AddrPortFrom(a, q.Port).String())
		}
		parts = append(parts, strings.Join(as, ", "))
	}
	return strings.Join(parts, " at ")
}

func proxy(p datapath.Proxy) string {
	var as []string
	for _, a := range []netip.AddrPort{p.V4, p.V6} {
		if a.IsValid() {
			as = append(as, a.String())
		}
	}
	if as == nil {
		return "-"
	}
	return fmt.Sprintf("%s (netns cookie %d)", strings.Join(as, ", "), p.NetNSCookie)
}

func joinAddrs(as []netip.Addr) string {
	var s []string
	for _, a := range as {
		s = append(s, a.String())
	}
	return strings.Join(s, ", ")
}

func failurePolicy(p snapshot.FailurePolicy) string {
	switch p {
	case snapshot.FailOpen:
		return "FailOpen: while the proxy is down, connects go to the Service address directly"
	case snapshot.FailClosed, "":
		return "FailClosed: while the proxy is down, connects are refused, never sent around it"
	}
	return string(p)
}

// backendBlock writes one backend's properties.
func backendBlock(w io.Writer, indent int, be explain.Backend) {
	b := newBlock(w, indent)
	b.add("Backend", "%s", be.Ref)
	var srcs []string
	for _, s := range be.Sources {
		src := s.String()
		if s.Kind == string(snapshot.KindService) && be.AppProtocol != "" {
			src += fmt.Sprintf(" (appProtocol %s on port %d)", be.AppProtocol, be.Ref.Port)
		}
		srcs = append(srcs, src)
	}
	b.add("Sources", "%s", orDash(strings.Join(srcs, ", ")))
	proto := string(be.Protocol)
	if proto == "" {
		proto = "(none declared)"
	}
	b.add("Protocol", "%s", proto)
	b.add("Wire", "%s", be.Wire)
	if be.Hostname != "" {
		b.add("Hostname", "%s", be.Hostname)
	}
	eps := fmt.Sprintf("%d (%d ready", be.Endpoints, be.ReadyEndpoints)
	if be.FallbackEndpoints > 0 {
		eps += fmt.Sprintf(", %d fallback in other zones or nodes: used only while no ready one takes connections", be.FallbackEndpoints)
	}
	if be.DrainingEndpoints > 0 {
		eps += fmt.Sprintf(", %d serving while terminating: used only while none is ready", be.DrainingEndpoints)
	}
	b.add("Endpoints", "%s)", eps)
	if t := be.TLS; t != nil {
		b.add("TLS", "%s, policy %s", t.Mode, t.Policy)
		b.add("SNI", "%s", t.ServerName)
		if len(t.SubjectAltNames) > 0 {
			var sans []string
			for _, s := range t.SubjectAltNames {
				sans = append(sans, fmt.Sprintf("%s %s", s.Type, s.Value))
			}
			b.add("Verify SANs", "%s", strings.Join(sans, ", "))
		} else {
			b.add("Verify name", "%s", t.ServerName)
		}
		if t.SystemRoots {
			b.add("Trust", "system roots")
		}
		for i, ca := range t.CAs {
			key := ""
			if i == 0 {
				key = "Trust"
			}
			if ca.Error != "" {
				b.add(key, "(%s)", ca.Error)
				continue
			}
			b.add(key, "%s (valid until %s)", ca.Subject, ca.NotAfter.Format(time.DateOnly))
		}
		if t.ClientCertificate != "" {
			b.add("Client cert", "%s", t.ClientCertificate)
		}
		b.add("ALPN", "%s", orDash(strings.Join(t.ALPN, ", ")))
		switch {
		case t.MinVersion != "" && t.MaxVersion != "":
			b.add("Versions", "%s to %s", t.MinVersion, t.MaxVersion)
		case t.MinVersion != "":
			b.add("Versions", "%s or later", t.MinVersion)
		case t.MaxVersion != "":
			b.add("Versions", "up to %s", t.MaxVersion)
		}
		if len(t.CipherSuites) > 0 {
			b.add("Ciphers", "%s", strings.Join(t.CipherSuites, ", "))
		}
		if len(t.Curves) > 0 {
			b.add("Curves", "%s", strings.Join(t.Curves, ", "))
		}
	} else if be.Invalid == nil {
		b.add("TLS", "none (cleartext)")
	}
	if inv := be.Invalid; inv != nil {
		b.add("Fails closed", "%s %s: %s", inv.Policy, inv.Reason, inv.Message)
	}
	if sp := be.SessionPersistence; sp != nil {
		b.add("Session", "%s %s", sp.Type, sp.Name)
	}
	if rc := be.RetryConstraint; rc != nil {
		b.add("Retry budget", "%d%% of requests over %s, at least %d per %s (%s)", rc.BudgetPercent,
			time.Duration(rc.BudgetInterval), rc.MinRetryCount, time.Duration(rc.MinRetryInterval), rc.Policy)
	}
	b.flush()
}

func routesTable(w io.Writer, indent int, rules []explain.Rule) {
	pad := strings.Repeat(" ", indent)
	t := tw(w)
	row(t, pad+"ROUTE", "RULE", "MATCHES", "BACKENDS")
	for _, r := range rules {
		rule := fmt.Sprint(r.Index)
		if r.Name != "" {
			rule += " (" + r.Name + ")"
		}
		matches := strings.Join(r.Matches, "; ")
		if matches == "" {
			matches = "every request"
		}
		backends := strings.Join(r.Backends, "; ")
		if r.Invalid != nil {
			backends = fmt.Sprintf("500: %s: %s", r.Invalid.Reason, r.Invalid.Message)
		}
		row(t, pad+r.Route.String(), rule, matches, orDash(backends))
	}
	t.Flush()
}

// related writes what the cluster says about the destination Service.
func related(w io.Writer, s *describe.Service) {
	if len(s.Policies)+len(s.TrafficPolicies)+len(s.XBackends)+len(s.Routes) == 0 {
		fmt.Fprintf(w, "Cluster: no BackendTLSPolicy, XBackendTrafficPolicy, XBackend or route names Service %s\n", s.Service)
	} else {
		fmt.Fprintf(w, "Cluster: objects naming Service %s (status as translate computes it now):\n", s.Service)
		objects(w, 2, s.Policies, s.TrafficPolicies, s.XBackends, s.Routes)
	}
	for _, warn := range s.Warnings {
		fmt.Fprintf(w, "Warning: %s\n", warn)
	}
}

// objects writes each object with its conditions.
func objects(w io.Writer, indent int, groups ...[]describe.Object) {
	pad := strings.Repeat(" ", indent)
	t := tw(w)
	row(t, pad+"OBJECT", "CREATED", "TOWARD", "CONDITION", "REASON", "MESSAGE")
	for _, objs := range groups {
		for _, o := range objs {
			first := true
			head := func() (name, created string) {
				if !first {
					return "", ""
				}
				first = false
				if o.Created.IsZero() {
					return o.Ref.String(), "-"
				}
				return o.Ref.String(), o.Created.Format(time.DateTime)
			}
			for _, a := range o.Ancestors {
				for _, c := range a.Conditions {
					name, created := head()
					row(t, pad+name, created, a.Ref, c.Type+"="+c.Status, c.Reason, c.Message)
				}
				if a.NoStatus != "" {
					name, created := head()
					row(t, pad+name, created, a.Ref, "no status entry", "-", a.NoStatus)
				}
			}
			if first {
				name, created := head()
				row(t, pad+name, created, "-", "-", "-", "no status")
			}
		}
	}
	t.Flush()
}
