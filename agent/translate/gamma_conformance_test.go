package translate_test

import (
	"cmp"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/agent/translate"
	"github.com/sockmesh/sockmesh/userspace-proxy/routes"
)

// confRequest is one request of a Gateway API mesh conformance test and
// what it must get. A test-only import of userspace-proxy/routes: the
// decisions are translate's Snapshot as the proxy reads it, so this checks
// both halves against the suite without sockets; the e2e suite runs the
// same scenarios through the real proxy.
type confRequest struct {
	from                 string // client namespace; default gateway-conformance-mesh
	to                   string // "service:port" in gateway-conformance-mesh; default echo:80
	method, path, query  string
	host                 string // default: the service's name, as the suite's client sends
	headers              map[string]string
	backend              string // the Service the request reaches
	unrouted             bool   // no route applies (the frontend's own backend, or no capture)
	status               int    // Respond or Redirect
	location             string // Redirect
	upstreamPath         string
	upstreamHost         string
	upstreamHeaders      map[string]string
	upstreamAbsent       []string
	responseHeaders      map[string]string
	responseAbsentHeader string
}

const confNS = "gateway-conformance-mesh"

// TestGammaConformanceDecisions ports the requests of the Gateway API
// v1.7.0 mesh conformance tests (conformance/tests/mesh/*.go) to decisions
// on the Snapshot translate builds from their manifests.
func TestGammaConformanceDecisions(t *testing.T) {
	headerCases := []confRequest{
		{path: "/set", headers: map[string]string{"Some-Other-Header": "val"}, backend: "echo-v1", upstreamPath: "/set",
			upstreamHeaders: map[string]string{"Some-Other-Header": "val", "X-Header-Set": "set-overwrites-values"}},
		{path: "/set", headers: map[string]string{"Some-Other-Header": "val", "X-Header-Set": "some-other-value"}, backend: "echo-v1",
			upstreamHeaders: map[string]string{"X-Header-Set": "set-overwrites-values"}},
		{path: "/add", headers: map[string]string{"X-Header-Add": "some-other-value"}, backend: "echo-v1",
			upstreamHeaders: map[string]string{"X-Header-Add": "some-other-value,add-appends-values"}},
		{path: "/remove", headers: map[string]string{"X-Header-Remove": "val"}, backend: "echo-v1", upstreamAbsent: []string{"X-Header-Remove"}},
		{path: "/multiple", headers: map[string]string{"X-Header-Set-2": "set-val-2", "X-Header-Add-2": "add-val-2", "X-Header-Remove-2": "remove-val-2", "Another-Header": "another-header-val"},
			backend: "echo-v1", upstreamHeaders: map[string]string{"X-Header-Set-1": "header-set-1", "X-Header-Set-2": "header-set-2", "X-Header-Add-1": "header-add-1",
				"X-Header-Add-2": "add-val-2,header-add-2", "X-Header-Add-3": "header-add-3", "Another-Header": "another-header-val"},
			upstreamAbsent: []string{"X-Header-Remove-1", "X-Header-Remove-2"}},
		{path: "/case-insensitivity", headers: map[string]string{"x-header-set": "original-val-set", "x-header-add": "original-val-add", "x-header-remove": "original-val-remove"},
			backend: "echo-v1", upstreamHeaders: map[string]string{"X-Header-Set": "header-set", "X-Header-Add": "original-val-add,header-add"},
			upstreamAbsent: []string{"X-Header-Remove"}},
	}
	cases := map[string][]confRequest{
		"httproute-simple-same-namespace": {{path: "/", backend: "echo-v1"}},
		"mesh-split": {
			{path: "/v1", backend: "echo-v1"},
			{path: "/v2", backend: "echo-v2"},
			{path: "/v3", status: 404},
		},
		"httproute-matching": {
			{path: "/", backend: "echo-v1"},
			{path: "/example", backend: "echo-v1"},
			{path: "/", headers: map[string]string{"Version": "one"}, backend: "echo-v1"},
			{path: "/v2", backend: "echo-v2"},
			{path: "/v2/example", backend: "echo-v2"},
			{path: "/", headers: map[string]string{"Version": "two"}, backend: "echo-v2"},
			{path: "/v2/", backend: "echo-v2"},
			{path: "/v2example", backend: "echo-v1"},
			{path: "/foo/v2/example", backend: "echo-v1"},
		},
		"httproute-query-param-matching": {
			{path: "/", query: "animal=whale", backend: "echo-v1"},
			{path: "/", query: "animal=dolphin", backend: "echo-v2"},
			{path: "/", query: "animal=whale&otherparam=irrelevant", backend: "echo-v1"},
			{path: "/", query: "animal=dolphin&color=yellow", backend: "echo-v2"},
			{path: "/", query: "color=blue", status: 404},
			{path: "/", query: "animal=dog", status: 404},
			{path: "/", query: "animal=whaledolphin", status: 404},
			{path: "/", status: 404},
			{path: "/path1", query: "animal=whale", backend: "echo-v1"},
			{path: "/", query: "animal=whale", headers: map[string]string{"version": "one"}, backend: "echo-v2"},
			{path: "/path3", query: "animal=shark", backend: "echo-v1"},
			{path: "/path4", query: "animal=kraken", headers: map[string]string{"version": "three"}, backend: "echo-v1"},
			{path: "/", query: "animal=shark", status: 404},
			{path: "/path4", query: "animal=kraken", status: 404},
			{path: "/path5", query: "animal=hydra", backend: "echo-v1"},
		},
		"httproute-redirect-host-and-status": {
			{path: "/hostname-redirect", status: 302, location: "http://example.org/hostname-redirect"},
			{path: "/host-and-status", status: 301, location: "http://example.org/host-and-status"},
		},
		"httproute-redirect-path": {
			{path: "/original-prefix/lemon", status: 302, location: "http://echo/replacement-prefix/lemon"},
			{path: "/full/path/original", status: 302, location: "http://echo/full-path-replacement"},
			{path: "/path-and-host", status: 302, location: "http://example.org/replacement-prefix"},
			{path: "/path-and-status", status: 301, location: "http://echo/replacement-prefix"},
			{path: "/full-path-and-host", status: 302, location: "http://example.org/replacement-full"},
			{path: "/full-path-and-status", status: 301, location: "http://echo/replacement-full"},
		},
		"httproute-redirect-port": {
			{path: "/port", status: 302, location: "http://echo:8083/port"},
			{path: "/port-and-host", status: 302, location: "http://example.org:8083/port-and-host"},
			{path: "/port-and-status", status: 301, location: "http://echo:8083/port-and-status"},
			{path: "/port-and-host-and-status", status: 302, location: "http://example.org:8083/port-and-host-and-status"},
		},
		"httproute-redirect-scheme": {
			{path: "/scheme", status: 302, location: "https://echo/scheme"},
			{path: "/scheme-and-host", status: 302, location: "https://example.org/scheme-and-host"},
			{path: "/scheme-and-status", status: 301, location: "https://echo/scheme-and-status"},
			{path: "/scheme-and-host-and-status", status: 302, location: "https://example.org/scheme-and-host-and-status"},
		},
		"httproute-303-redirect": {{path: "/redirect", status: 303, location: "http://echo/redirect"}},
		"httproute-307-redirect": {{path: "/temporary", status: 307, location: "http://echo/temporary"}},
		"httproute-308-redirect": {{path: "/permanent", status: 308, location: "http://echo/permanent"}},
		"httproute-rewrite-path": {
			{path: "/prefix/one/two", backend: "echo-v1", upstreamPath: "/one/two"},
			{path: "/strip-prefix/three", backend: "echo-v1", upstreamPath: "/three"},
			{path: "/strip-prefix", backend: "echo-v1", upstreamPath: "/"},
			{path: "/full/one/two", backend: "echo-v1", upstreamPath: "/one"},
			{path: "/full/rewrite-path-and-modify-headers/test", backend: "echo-v1", upstreamPath: "/test",
				headers:         map[string]string{"X-Header-Remove": "remove-val", "X-Header-Add-Append": "append-val-1", "X-Header-Set": "set-val"},
				upstreamHeaders: map[string]string{"X-Header-Add": "header-val-1", "X-Header-Add-Append": "append-val-1,header-val-2", "X-Header-Set": "set-overwrites-values"},
				upstreamAbsent:  []string{"X-Header-Remove"}},
			{path: "/prefix/rewrite-path-and-modify-headers/one", backend: "echo-v1", upstreamPath: "/prefix/one",
				headers:         map[string]string{"X-Header-Remove": "remove-val", "X-Header-Add-Append": "append-val-1", "X-Header-Set": "set-val"},
				upstreamHeaders: map[string]string{"X-Header-Add": "header-val-1", "X-Header-Add-Append": "append-val-1,header-val-2", "X-Header-Set": "set-overwrites-values"},
				upstreamAbsent:  []string{"X-Header-Remove"}},
		},
		"httproute-request-header-modifier":         headerCases,
		"httproute-request-header-modifier-backend": headerCases,
		"httproute-named-rule": {
			{path: "/named", backend: "echo-v1", upstreamPath: "/named"},
			{path: "/unnamed", backend: "echo-v2"},
		},
		"mesh-consumer-route": {
			{from: "gateway-conformance-mesh-consumer", to: "echo-v1:80", host: "echo-v1.gateway-conformance-mesh", path: "/",
				backend: "echo-v1", responseHeaders: map[string]string{"X-Header-Set": "set"}},
			{to: "echo-v1:80", host: "echo-v1.gateway-conformance-mesh", path: "/", unrouted: true, backend: "echo-v1", responseAbsentHeader: "X-Header-Set"},
		},
		"mesh-ports": {
			{to: "echo-v1:80", path: "/", backend: "echo-v1", responseHeaders: map[string]string{"X-Header-Set": "v1"}},
			{to: "echo-v1:8080", path: "/", unrouted: true, backend: "echo-v1"},
			{to: "echo-v2:80", path: "/", backend: "echo-v2", responseHeaders: map[string]string{"X-Header-Set": "v2"}},
			{to: "echo-v2:8080", path: "/", backend: "echo-v2", responseHeaders: map[string]string{"X-Header-Set": "v2"}},
		},
		// MeshFrontend and MeshFrontendHostname: the destination address
		// decides, not Host; a pod IP is not a frontend at all.
		"mesh-frontend": {
			{to: "echo-v2:80", path: "/", backend: "echo-v2", responseHeaders: map[string]string{"X-Header-Set": "set"}},
			{to: "echo-v2:80", host: "echo-v1", path: "/", backend: "echo-v2", responseHeaders: map[string]string{"X-Header-Set": "set"}},
			{to: "echo-v1:80", host: "echo-v2", path: "/", unrouted: true, backend: "echo-v1"},
			{to: "10.244.1.2:8080", path: "/", unrouted: true},
		},
		"grpcroute-request-header-modifier": {
			{to: "echo:7070", method: "POST", path: "/grpc.testing.TestService/Echo", headers: map[string]string{"x-test-case": "set", "x-header-set": "this-value-should-be-overwritten"},
				backend: "echo-v1", upstreamHeaders: map[string]string{"X-Header-Set": "set-overwrites-values", "X-Test-Case": "set"}},
			{to: "echo:7070", method: "POST", path: "/grpc.testing.TestService/Echo", headers: map[string]string{"x-test-case": "add", "x-header-add": "this-value-should-be-appended"},
				backend: "echo-v1", upstreamHeaders: map[string]string{"X-Header-Add": "this-value-should-be-appended,add-appends-values"}},
			{to: "echo:7070", method: "POST", path: "/grpc.testing.TestService/Echo", headers: map[string]string{"x-test-case": "remove", "x-header-remove": "x"},
				backend: "echo-v1", upstreamAbsent: []string{"X-Header-Remove"}},
			{to: "echo:7070", method: "POST", path: "/grpc.testing.TestService/Echo", headers: map[string]string{"x-test-case": "multi", "x-header-add-2": "add-header-2", "x-header-remove-2": "x"},
				backend: "echo-v2", upstreamHeaders: map[string]string{"X-Header-Set-1": "header-set-1", "X-Header-Add-2": "add-header-2,header-add-2"},
				upstreamAbsent: []string{"X-Header-Remove-1", "X-Header-Remove-2"}},
			{to: "echo:7070", method: "POST", path: "/grpc.testing.TestService/Echo", status: 404},
		},
	}
	for name, reqs := range cases {
		t.Run(name, func(t *testing.T) {
			c := newConformanceCase(t, name)
			for i, req := range reqs {
				c.check(t, i, req)
			}
		})
	}
	for name, weights := range map[string]map[string]float64{
		"httproute-weight": {"echo-v1": 0.7, "echo-v2": 0.3},
		"grpcroute-weight": {"echo-v1": 0.7, "echo-v2": 0.3},
	} {
		t.Run(name, func(t *testing.T) {
			c := newConformanceCase(t, name)
			to := "echo:80"
			if strings.HasPrefix(name, "grpc") {
				to = "echo:7070"
			}
			set := c.set(t, "", to)
			rnd := rand.New(rand.NewPCG(3, 4))
			counts := map[string]int{}
			const n = 20000
			for range n {
				req := routes.Request{Method: "POST", Path: "/", Host: "echo", Header: http.Header{}}
				var d routes.Decision
				set.Decide(&req, rnd, &d)
				if d.Action != routes.Forward {
					t.Fatalf("decision %+v, want Forward (the weight-0 backend that does not exist must get nothing)", d)
				}
				counts[d.Backend.Name]++
			}
			for backend, share := range weights {
				if got := float64(counts[backend]) / n; got < share-0.02 || got > share+0.02 {
					t.Errorf("%s got %.3f of requests, want %.2f ± 0.02 (%v)", backend, got, share, counts)
				}
			}
		})
	}
}

type conformanceCase struct {
	in    translate.Input
	snap  *snapshot.Snapshot
	table *routes.Table
}

func newConformanceCase(t *testing.T, name string) *conformanceCase {
	t.Helper()
	return newDecisionCase(t, "testdata/conformance/"+name+".in.yaml")
}

// newDecisionCase translates the fixture at path and compiles its routes
// as the proxy does.
func newDecisionCase(t *testing.T, path string) *conformanceCase {
	t.Helper()
	in := loadInput(t, path)
	res, err := translate.Translate(in)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := snapshot.New(1, res.Frontends, res.Backends, res.Workloads)
	if err != nil {
		t.Fatal(err)
	}
	return &conformanceCase{in: in, snap: snap, table: routes.Compile(snap)}
}

// frontend resolves "service:port" (or "ip:port") to the captured frontend.
func (c *conformanceCase) frontend(t *testing.T, to string) (*snapshot.Frontend, bool) {
	t.Helper()
	name, port, _ := strings.Cut(to, ":")
	addr, err := netip.ParseAddr(name)
	if err != nil {
		for _, svc := range c.in.Services {
			if svc.Namespace == confNS && svc.Name == name {
				addr = netip.MustParseAddr(svc.Spec.ClusterIP)
			}
		}
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || !addr.IsValid() {
		t.Fatalf("destination %q is not service:port or ip:port", to)
	}
	return c.snap.Frontend(netip.AddrPortFrom(addr, uint16(p)))
}

func (c *conformanceCase) set(t *testing.T, from, to string) *routes.Set {
	f, ok := c.frontend(t, to)
	if !ok {
		t.Fatalf("%s is not captured", to)
	}
	return c.table.Lookup(f, from)
}

func (c *conformanceCase) check(t *testing.T, i int, want confRequest) {
	t.Helper()
	from, to := cmp.Or(want.from, confNS), cmp.Or(want.to, "echo:80")
	host := cmp.Or(want.host, strings.Split(to, ":")[0])
	r := &http.Request{Method: cmp.Or(want.method, http.MethodGet), Host: host, URL: &url.URL{Path: want.path, RawQuery: want.query}, Header: http.Header{}}
	for k, v := range want.headers {
		r.Header.Set(k, v)
	}
	f, captured := c.frontend(t, to)
	var set *routes.Set
	if captured {
		set = c.table.Lookup(f, from)
	}
	if set == nil {
		if !want.unrouted {
			t.Errorf("request %d (%s %s from %s): no route applies, want one", i, to, want.path, from)
		} else if captured && want.backend != "" && f.Backend.Name != want.backend {
			// Uncaptured, the client reaches the Service it dialled itself.
			t.Errorf("request %d (%s %s from %s): unrouted to %v, want %s", i, to, want.path, from, f.Backend, want.backend)
		}
		return
	}
	if want.unrouted {
		t.Errorf("request %d (%s %s from %s): a route applies, want none", i, to, want.path, from)
		return
	}
	req := routes.FromHTTP(r)
	var d routes.Decision
	set.Decide(&req, routes.GlobalRand{}, &d)
	switch {
	case want.location != "":
		if d.Action != routes.Redirect || d.Status != want.status || d.Location != want.location {
			t.Errorf("request %d (%s): %v %d %q, want Redirect %d %q", i, want.path, d.Action, d.Status, d.Location, want.status, want.location)
		}
		return
	case want.status != 0:
		if d.Action != routes.Respond || d.Status != want.status {
			t.Errorf("request %d (%s?%s): %v %d, want Respond %d", i, want.path, want.query, d.Action, d.Status, want.status)
		}
		return
	}
	if d.Action != routes.Forward || d.Backend.Name != want.backend {
		t.Errorf("request %d (%s?%s %v): %v to %q (%s), want Forward to %s", i, want.path, want.query, want.headers, d.Action, d.Backend.Name, d.Reason, want.backend)
		return
	}
	d.ApplyRequest(r)
	if want.upstreamPath != "" && r.URL.Path != want.upstreamPath {
		t.Errorf("request %d (%s): upstream path %q, want %q", i, want.path, r.URL.Path, want.upstreamPath)
	}
	if want.upstreamHost != "" && r.Host != want.upstreamHost {
		t.Errorf("request %d (%s): upstream host %q, want %q", i, want.path, r.Host, want.upstreamHost)
	}
	for k, v := range want.upstreamHeaders {
		// The echo server reports a repeated header joined by commas.
		if got := strings.Join(r.Header.Values(k), ","); got != v {
			t.Errorf("request %d (%s): upstream header %s = %q, want %q", i, want.path, k, got, v)
		}
	}
	// A removed field stays with a nil value (routes.Decision.ApplyRequest):
	// nothing of it is sent.
	for _, k := range want.upstreamAbsent {
		if vv := r.Header.Values(k); len(vv) > 0 {
			t.Errorf("request %d (%s): upstream header %s = %q, want absent", i, want.path, k, vv)
		}
	}
	resp := http.Header{}
	d.ApplyResponse(resp)
	for k, v := range want.responseHeaders {
		if got := resp.Get(k); got != v {
			t.Errorf("request %d (%s): response header %s = %q, want %q", i, want.path, k, got, v)
		}
	}
	if len(resp.Values(want.responseAbsentHeader)) > 0 {
		t.Errorf("request %d (%s): response header %s present, want absent", i, want.path, want.responseAbsentHeader)
	}
}
