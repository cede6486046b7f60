package main

import (
	"os/exec"
	"strings"
	"testing"
)

// allowedModules are the modules besides the standard library the plugin
// may link: the kubelet runs it for every pod sandbox, so it stays small
// and starts fast (about 5 MB; it linked Prometheus, and with it net/http,
// protobuf and crypto, through the agent's handover server: 10 MB).
var allowedModules = []string{
	"github.com/containernetworking/cni/", // skel, the result types
	"github.com/vishvananda/netns",        // containernetworking/cni/pkg/ns
	"golang.org/x/sys/",
	"github.com/sockmesh/sockmesh/agent/cniwire", // the protocol, light by rule
	"github.com/sockmesh/sockmesh/cmd/sockmesh-cni",
}

// heavyStd are standard packages the plugin has no use for, which arrive
// with heavy dependencies (an HTTP client or server, TLS).
var heavyStd = []string{"net/http", "crypto/tls", "crypto/x509"}

// TestImports keeps the plugin's import graph to what it needs.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing: nothing to check")
	}
	for _, d := range deps {
		std := !strings.Contains(strings.SplitN(d, "/", 2)[0], ".")
		switch {
		case std && hasPrefix(d, heavyStd):
			t.Errorf("sockmesh-cni links %s: the plugin needs no HTTP or TLS", d)
		case !std && !hasPrefix(d, allowedModules):
			t.Errorf("sockmesh-cni links %s: the plugin links only %v (and the standard library)", d, allowedModules)
		}
	}
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
