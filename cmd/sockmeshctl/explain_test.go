package main

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/must"
	"github.com/sockmesh/sockmesh/test/apiserver"
)

func TestParseDestination(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    destination
		wantErr string
	}{
		{in: "secure:443", want: destination{service: snapshot.ObjectRef{Namespace: "app", Name: "secure"}, port: "443"}},
		{in: "secure.web.svc.cluster.local:https", want: destination{service: snapshot.ObjectRef{Namespace: "web", Name: "secure"}, port: "https"}},
		{in: "web/secure:443", want: destination{service: snapshot.ObjectRef{Namespace: "web", Name: "secure"}, port: "443"}},
		{in: "10.96.0.10:80", want: destination{addr: netip.MustParseAddr("10.96.0.10"), port: "80"}},
		{in: "[fd00::10]:80", want: destination{addr: netip.MustParseAddr("fd00::10"), port: "80"}},
		{in: "[::ffff:10.96.0.10]:80", want: destination{addr: netip.MustParseAddr("10.96.0.10"), port: "80"}},
		// Without brackets the port cannot be told from the address; the
		// answer says how to write it rather than that it is no IP:PORT.
		{in: "fd00::10:80", wantErr: "write an IPv6 address in brackets: [fd00::10]:80"},
		{in: "secure", wantErr: "want SERVICE:PORT, IPv4:PORT or [IPv6]:PORT"},
		{in: "a.b.c:80", wantErr: "want NAME, NAME.NAMESPACE or NAME.NAMESPACE.svc"},
		{in: "web/:80", wantErr: "empty namespace or name"},
	} {
		got, err := parseDestination(c.in, "app")
		switch {
		case c.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("parseDestination(%q) = %+v, %v; want an error saying %q", c.in, got, err, c.wantErr)
			}
		case err != nil || got != c.want:
			t.Errorf("parseDestination(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func TestParseRef(t *testing.T) {
	for _, c := range []struct {
		in   string
		want snapshot.ObjectRef
	}{
		{"client", snapshot.ObjectRef{Namespace: "app", Name: "client"}},
		{"web/client", snapshot.ObjectRef{Namespace: "web", Name: "client"}},
	} {
		if got, err := parseRef(c.in, "app"); err != nil || got != c.want {
			t.Errorf("parseRef(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	// Each reached the API server as a name it refused or a namespace it
	// listed ("Service app/: not found" for "app/").
	for _, in := range []string{"app/", "/client", "", "app/client/x"} {
		if got, err := parseRef(in, "app"); err == nil || !strings.Contains(err.Error(), "want NAME or NAMESPACE/NAME") {
			t.Errorf("parseRef(%q) = %+v, %v; want an error", in, got, err)
		}
	}
}

// TestExplainWithoutClusterIP: explain of an ExternalName Service said
// "no port 80 in Service app/ext (ports: )", and of a headless one what
// the agent said of any uncaptured Service, that no policy gives it
// backend properties (though a BackendTLSPolicy may target it). Neither
// has a ClusterIP, the only destination the datapath captures: explain
// says so without asking the agent (there is none here).
func TestExplainWithoutClusterIP(t *testing.T) {
	api := apiserver.Start(t)
	ctx, kube := t.Context(), api.Kube
	must.Succeed(t)(kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	// No controller manager runs: make the ServiceAccount pods need.
	must.Succeed(t)(kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
	no := false
	must.Succeed(t)(kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: "node-a", AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
	}, metav1.CreateOptions{}))
	for name, spec := range map[string]corev1.ServiceSpec{
		"ext":      {Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com"},
		"headless": {ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		"plain":    {Ports: []corev1.ServicePort{{Port: 80}}},
	} {
		must.Succeed(t)(kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}, metav1.CreateOptions{}))
	}
	for _, c := range []struct{ dst, want string }{
		{"ext:80", "service app/ext is an ExternalName Service, a DNS alias for db.example.com with no ClusterIP, so sockmesh never captures connections to it"},
		{"headless:80", "service app/headless is headless (clusterIP None): clients connect to its pods' addresses directly, so sockmesh never captures connections to it"},
		// An unnamed port was listed as "/80".
		{"plain:8080", "no port 8080 in Service app/plain (ports: 80)"},
	} {
		out, err := runCtl("explain", "--kubeconfig="+api.Kubeconfig, "--agent-socket="+filepath.Join(t.TempDir(), "none.sock"), "-n", ns, "client", c.dst)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("explain client %s: error %v, want %q; output:\n%s", c.dst, err, c.want, out)
		}
	}
}
