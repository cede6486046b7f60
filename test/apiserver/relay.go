package apiserver

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/sockmesh/sockmesh/internal/tcpserve"
)

// KubeconfigVia returns the path of a kubeconfig that reaches the API
// server through ln, for a process in another network namespace (an agent
// in a test's node namespace): the API server listens on this process's
// loopback, and every connection ln accepts is relayed to it from here
// until t ends. The serving certificate names 127.0.0.1, so TLS verifies
// when ln listens on 127.0.0.1.
func (e *Env) KubeconfigVia(t testing.TB, ln net.Listener) string {
	t.Helper()
	tcpserve.Relay(t, ln, strings.TrimPrefix(e.Config.Host, "https://"))
	cfg, err := clientcmd.LoadFromFile(e.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range cfg.Clusters {
		cl.Server = "https://" + ln.Addr().String()
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
