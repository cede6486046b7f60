package main

import (
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// TestTranslateFailuresShown: an object whose translation panicked was
// told by the agent's log and a metric alone, so sockmeshctl showed a
// route that did not apply, or a backend failing closed, with no word of
// why. status lists it with the panic, and explain names it for a
// destination Service it governs, from the agent's introspection API.
func TestTranslateFailuresShown(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir()) // no ~/.kube/config: the agent alone is asked
	web := snapshot.ObjectRef{Namespace: "app", Name: "web"}
	be := snapshot.BackendRef{Kind: snapshot.KindService, Namespace: "app", Name: "web", Port: 80}
	client := snapshot.ObjectRef{Namespace: "app", Name: "client"}
	snap, err := snapshot.New(3, []snapshot.Frontend{{Service: web, Port: 80, Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Backend: be}},
		[]snapshot.Backend{{Ref: be}}, []snapshot.Workload{{Pod: client, Enrolled: true}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	srv, err := httpapi.NewServer(httpapi.Config{Socket: sock}, &introspect.Sources{Node: "node-a", Ready: func() error { return nil },
		Applied: func() (*snapshot.Snapshot, time.Time) { return snap, time.Now() },
		Failures: func() []translate.Failure {
			return []translate.Failure{{Object: snapshot.ObjectRef{Kind: "HTTPRoute", Namespace: "app", Name: "split"},
				Panic: "assignment to entry in nil map", Stack: "goroutine 1 [running]:\nrouting.go:12", Services: []snapshot.ObjectRef{web}}}
		}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)

	out, err := runCtl("status", "--agent-socket="+sock)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if !strings.Contains(out, "Objects whose translation panicked") || !regexp.MustCompile(`HTTPRoute\s+app/split\s+app/web\s+assignment to entry in nil map`).MatchString(out) {
		t.Errorf("status does not list HTTPRoute app/split's failure:\n%s", out)
	}
	out, err = runCtl("explain", "--agent-socket="+sock, "app/client", "10.96.0.10:80")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	if !strings.Contains(out, "the translation of HTTPRoute app/split panicked (internal error: assignment to entry in nil map)") {
		t.Errorf("explain of app/web does not name HTTPRoute app/split's failure:\n%s", out)
	}
}
