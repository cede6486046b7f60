package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/ctl/describe"
	"github.com/sockmesh/sockmesh/ctl/render"
)

const explainLong = `explain says what happens when POD connects to DESTINATION:PORT: whether
the pod is enrolled (and why not: an opt-out label on the pod or its
namespace, hostNetwork, its network namespace not found), whether the
address is captured, which policies, routes and backends apply (their
objects named), the TLS settings and protocol the proxy will use, whether
it fails open or closed (and why a backend fails closed), and the
datapath's decision counters for this pod and address — or why nothing
applies.

POD is NAME or NAMESPACE/NAME. DESTINATION is a Service (NAME, NAME.NAMESPACE,
NAMESPACE/NAME; NAME alone is in the pod's namespace) or an IP address,
an IPv6 one in brackets ([fd00::10]:80); PORT is a number or, for a
Service, a port name.

The pod's node comes from the API server; the answer from that node's
agent (its socket, or --agent-port / --agent-address). Without a
kubeconfig, explain asks the agent alone: name the Service's port by
number then. A Service without a ClusterIP (ExternalName, headless) is
never captured: explain says so and why, and asks no agent (exit status 1).`

func newExplainCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "explain POD DESTINATION:PORT",
		Short:   "explain what happens to a pod's connections to a destination, and why",
		Long:    explainLong,
		Example: "  sockmeshctl explain -n app client secure:443\n  sockmeshctl explain app/client 10.96.0.10:80 -o yaml",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*g.timeout)
			defer cancel()
			e, err := runExplain(ctx, g, args[0], args[1], cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return render.Print(cmd.OutOrStdout(), f, e, func(w io.Writer) error { return render.Explain(w, e) })
		},
	}
}

// destination is DESTINATION:PORT as typed.
type destination struct {
	addr    netip.Addr // set for an IP
	service snapshot.ObjectRef
	port    string
}

func parseDestination(s, podNS string) (destination, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || port == "" {
		// fd00::1:80 is an address of its own: only brackets set the port apart.
		if i := strings.LastIndex(s, ":"); i > 0 && !strings.Contains(s, "[") {
			if a, err := netip.ParseAddr(s[:i]); err == nil && a.Is6() {
				return destination{}, fmt.Errorf("destination %q: write an IPv6 address in brackets: [%s]:%s", s, s[:i], s[i+1:])
			}
		}
		return destination{}, fmt.Errorf("destination %q: want SERVICE:PORT, IPv4:PORT or [IPv6]:PORT", s)
	}
	d := destination{port: port}
	if a, err := netip.ParseAddr(host); err == nil {
		d.addr = a.Unmap()
		return d, nil
	}
	if ns, name, ok := strings.Cut(host, "/"); ok {
		d.service = snapshot.ObjectRef{Namespace: ns, Name: name}
	} else {
		// name, name.namespace, name.namespace.svc[.cluster.domain]
		parts := strings.Split(host, ".")
		d.service = snapshot.ObjectRef{Namespace: podNS, Name: parts[0]}
		if len(parts) > 1 {
			d.service.Namespace = parts[1]
		}
		if len(parts) > 2 && parts[2] != "svc" {
			return destination{}, fmt.Errorf("destination %q: want NAME, NAME.NAMESPACE or NAME.NAMESPACE.svc[.DOMAIN]", host)
		}
	}
	if d.service.Namespace == "" || d.service.Name == "" {
		return destination{}, fmt.Errorf("destination %q: empty namespace or name", host)
	}
	return d, nil
}

// parseRef reads NAME (in namespace ns) or NAMESPACE/NAME: explain's POD,
// describe's NAME. An empty part would reach the API server as a request
// for no name at all.
func parseRef(s, ns string) (snapshot.ObjectRef, error) {
	ref := snapshot.ObjectRef{Namespace: ns, Name: s}
	if n, name, ok := strings.Cut(s, "/"); ok {
		ref = snapshot.ObjectRef{Namespace: n, Name: name}
	}
	if ref.Namespace == "" || ref.Name == "" || strings.Contains(ref.Name, "/") {
		return snapshot.ObjectRef{}, fmt.Errorf("%q: want NAME or NAMESPACE/NAME", s)
	}
	return ref, nil
}

// runExplain resolves the pod and destination through the API server when
// there is one, asks the pod's node's agent, and adds what the cluster
// says about the destination Service. warn receives what could not be
// looked up.
func runExplain(ctx context.Context, g *globals, podArg, dstArg string, warn io.Writer) (render.Explained, error) {
	pod, err := parseRef(podArg, g.ns())
	if err != nil {
		return render.Explained{}, fmt.Errorf("pod %w", err)
	}
	dst, err := parseDestination(dstArg, pod.Namespace)
	if err != nil {
		return render.Explained{}, err
	}
	q := explain.Query{Pod: pod}
	if dst.addr.IsValid() {
		q.Addrs = []netip.Addr{dst.addr}
	} else {
		svc := dst.service
		q.Service = &svc
	}
	var node string
	var related *describe.Service
	kube, gw, kerr := g.kube()
	switch {
	case errors.Is(kerr, errNoKubeconfig):
		fmt.Fprintf(warn, "Warning: %v; asking the agent alone\n", kerr)
		port, err := strconv.ParseUint(dst.port, 10, 16)
		if err != nil || port == 0 {
			return render.Explained{}, fmt.Errorf("port %q: without the API server, name the port by number", dst.port)
		}
		q.Port = uint16(port)
	case kerr != nil:
		return render.Explained{}, kerr
	default:
		p, err := kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return render.Explained{}, fmt.Errorf("pod %s: %w", pod, err)
		}
		if node = p.Spec.NodeName; node == "" {
			return render.Explained{}, fmt.Errorf("pod %s is not scheduled to a node yet", pod)
		}
		svc, err := resolveService(ctx, kube, &q, dst, pod.Namespace, warn)
		if err != nil {
			return render.Explained{}, err
		}
		if svc != nil {
			related = relatedObjects(ctx, kube, gw, svc, warn)
		}
	}
	client, err := g.agentFor(ctx, node)
	if err != nil {
		return render.Explained{}, err
	}
	e, err := client.Explain(ctx, q)
	if err != nil {
		return render.Explained{}, err
	}
	if node != "" && e.Node != node {
		return render.Explained{}, fmt.Errorf("the agent at %s serves node %q, but pod %s runs on node %q: run sockmeshctl on that node, or reach its agent with --agent-port or --agent-address",
			client.Where(), e.Node, pod, node)
	}
	return render.Explained{Explanation: e, Related: related}, nil
}

// resolveService completes q from the API server: a Service's ClusterIPs
// and port number, or the Service that owns an IP. It returns the
// Service, if any. A user who may not list Services cluster-wide (an app
// team's namespaced Role) has those of podNS searched for an IP instead;
// failing that the agent, which knows every captured address, names the
// Service, and warn says so.
func resolveService(ctx context.Context, kube kubernetes.Interface, q *explain.Query, dst destination, podNS string, warn io.Writer) (*corev1.Service, error) {
	var svc *corev1.Service
	searchedNS := "" // set when only podNS's Services could be searched
	if dst.addr.IsValid() {
		list, err := kube.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		if apierrors.IsForbidden(err) {
			searchedNS = podNS
			list, err = kube.CoreV1().Services(podNS).List(ctx, metav1.ListOptions{})
		}
		if err != nil {
			return nil, fmt.Errorf("find the Service of %s: %w", dst.addr, err)
		}
		for i := range list.Items {
			if slices.ContainsFunc(list.Items[i].Spec.ClusterIPs, func(ip string) bool {
				a, err := netip.ParseAddr(ip)
				return err == nil && a.Unmap() == dst.addr
			}) {
				svc = &list.Items[i]
				q.Service = &snapshot.ObjectRef{Namespace: svc.Namespace, Name: svc.Name}
				break
			}
		}
	} else {
		s, err := kube.CoreV1().Services(dst.service.Namespace).Get(ctx, dst.service.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("no Service %s", dst.service)
		}
		if err != nil {
			return nil, fmt.Errorf("get Service %s: %w", dst.service, err)
		}
		// The agent holds only what it captures: it could only answer that
		// no policy applies.
		if why := describe.NoClusterIP(s); why != "" {
			return nil, fmt.Errorf("service %s/%s %s", s.Namespace, s.Name, why)
		}
		svc = s
		for _, ip := range svc.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				q.Addrs = append(q.Addrs, a.Unmap())
			}
		}
	}
	port, err := strconv.ParseUint(dst.port, 10, 16)
	if err == nil && port > 0 {
		q.Port = uint16(port)
	}
	if svc == nil {
		if searchedNS != "" {
			fmt.Fprintf(warn, "Warning: cannot list Services cluster-wide (forbidden), and none in namespace %s has address %s: the agent alone names the Service\n",
				searchedNS, dst.addr)
		}
		if q.Port == 0 {
			return nil, fmt.Errorf("port %q: no Service has address %s to name it", dst.port, dst.addr)
		}
		return nil, nil
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Name == dst.port || q.Port != 0 && uint16(p.Port) == q.Port
	})
	if i < 0 {
		var ports []string
		for _, p := range svc.Spec.Ports {
			port := fmt.Sprint(p.Port) // an only port may go unnamed
			if p.Name != "" {
				port = fmt.Sprintf("%s/%d", p.Name, p.Port)
			}
			ports = append(ports, port)
		}
		return nil, fmt.Errorf("no port %s in Service %s/%s (ports: %s)", dst.port, svc.Namespace, svc.Name, strings.Join(ports, ", "))
	}
	q.Port = uint16(svc.Spec.Ports[i].Port)
	return svc, nil
}

// relatedObjects describes svc from the cluster's objects; failures are
// warnings, since the agent's answer stands without them.
func relatedObjects(ctx context.Context, kube kubernetes.Interface, gw gwclient.Interface, svc *corev1.Service, warn io.Writer) *describe.Service {
	in, warnings, err := describe.Load(ctx, kube, gw, time.Now(), svc.Namespace)
	if err == nil {
		var c *describe.Cluster
		if c, err = describe.New(in, warnings); err == nil {
			var s *describe.Service
			if s, err = c.Service(svc.Namespace, svc.Name); err == nil {
				return s
			}
		}
	}
	fmt.Fprintf(warn, "Warning: cannot describe Service %s/%s from the cluster's objects: %v\n", svc.Namespace, svc.Name, err)
	return nil
}
