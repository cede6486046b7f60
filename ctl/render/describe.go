package render

import (
	"fmt"
	"io"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/sockmesh/sockmesh/ctl/describe"
)

// Service writes a Service's effective backend properties.
func Service(w io.Writer, s *describe.Service) error {
	fmt.Fprintf(w, "Service %s\n", s.Service)
	if s.NoClusterIP != "" {
		fmt.Fprintf(w, "  Not captured: it %s\n", s.NoClusterIP)
	}
	servicePorts(w, s)
	if len(s.Policies)+len(s.TrafficPolicies)+len(s.XBackends)+len(s.Routes) > 0 {
		fmt.Fprintln(w, "Objects naming it (status as translate computes it now; the oldest policy wins among equals):")
		objects(w, 2, s.Policies, s.TrafficPolicies, s.XBackends, s.Routes)
	} else {
		fmt.Fprintln(w, "Objects naming it: none")
	}
	translateFailures(w, "", s.Failures)
	warnings(w, s.Warnings)
	return nil
}

func servicePorts(w io.Writer, s *describe.Service) {
	for _, p := range s.Ports {
		name := fmt.Sprint(p.Port)
		if p.Name != "" {
			name = fmt.Sprintf("%s (%d)", p.Name, p.Port)
		}
		if p.AppProtocol != "" {
			name += ", appProtocol " + p.AppProtocol
		}
		if !p.Captured {
			why := "no backend properties: connections go to the Service untouched"
			switch {
			case s.NoClusterIP != "":
				why = "the Service has no ClusterIP"
			case p.Protocol != corev1.ProtocolTCP:
				why = fmt.Sprintf("a %s port: sockmesh captures TCP only", p.Protocol)
			}
			fmt.Fprintf(w, "  Port %s: not captured (%s)\n", name, why)
			continue
		}
		fmt.Fprintf(w, "  Port %s: captured at %s\n", name, joinAddrs(p.Addresses))
		b := newBlock(w, 4)
		b.add("Failure policy", "%s", failurePolicy(p.FailurePolicy))
		b.flush()
		if p.Backend != nil {
			backendBlock(w, 4, *p.Backend)
		}
		for _, r := range p.Routes {
			fmt.Fprintf(w, "    Routes: %s %s set of namespace %s\n", r.Kind, r.Role, r.Namespace)
			routesTable(w, 6, r.Rules)
		}
	}
}

// Policy writes a BackendTLSPolicy and its targets.
func Policy(w io.Writer, p *describe.Policy) error {
	fmt.Fprintf(w, "%s\n", p.Policy.Ref)
	b := newBlock(w, 2)
	b.add("Hostname", "%s", p.Hostname)
	if p.WellKnownCACertificates != "" {
		b.add("CA", "well-known %s", p.WellKnownCACertificates)
	}
	b.add("CA refs", "%s", orDash(strings.Join(p.CARefs, ", ")))
	b.flush()
	fmt.Fprintln(w, "Status (as translate computes it now):")
	objects(w, 2, []describe.Object{p.Policy})
	for i := range p.Targets {
		fmt.Fprintf(w, "Target Service %s:\n", p.Targets[i].Service)
		servicePorts(w, &p.Targets[i])
		if len(p.Targets[i].Policies) > 1 {
			fmt.Fprintln(w, "  Policies competing for it (the oldest wins among equals):")
			objects(w, 4, p.Targets[i].Policies)
		}
	}
	translateFailures(w, "", p.Failures)
	warnings(w, p.Warnings)
	return nil
}

// XBackend writes an XBackend and the backend it makes.
func XBackend(w io.Writer, x *describe.XBackend) error {
	fmt.Fprintf(w, "%s\n", x.XBackend.Ref)
	fmt.Fprintln(w, "Status (as translate computes it now):")
	objects(w, 2, []describe.Object{x.XBackend})
	for _, be := range x.Backends {
		fmt.Fprintln(w, "Backend:")
		backendBlock(w, 2, be)
	}
	fmt.Fprintf(w, "Captured through: %s\n", orDash(strings.Join(x.Services, ", ")))
	translateFailures(w, "", x.Failures)
	warnings(w, x.Warnings)
	return nil
}

// Route writes an HTTPRoute or GRPCRoute and where its rules landed.
func Route(w io.Writer, r *describe.Route) error {
	fmt.Fprintf(w, "%s\n", r.Route.Ref)
	fmt.Fprintln(w, "Status (as translate computes it now):")
	objects(w, 2, []describe.Object{r.Route})
	if len(r.Placements) == 0 {
		fmt.Fprintln(w, "Rules: in no Service's route set")
	}
	for _, p := range r.Placements {
		fmt.Fprintf(w, "Rules in Service %s port %d (%s set of namespace %s):\n", p.Service, p.Port, p.Role, p.Namespace)
		routesTable(w, 2, p.Rules)
		for _, be := range p.Backends {
			fmt.Fprintf(w, "  Backend %s:\n", be.Ref)
			backendBlock(w, 4, be)
		}
	}
	translateFailures(w, "", r.Failures)
	warnings(w, r.Warnings)
	return nil
}

func warnings(w io.Writer, ws []string) {
	for _, warn := range ws {
		fmt.Fprintf(w, "Warning: %s\n", warn)
	}
}
