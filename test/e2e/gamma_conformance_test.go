package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// The gateway-api v1.7.0 mesh conformance tests (conformance/tests/mesh),
// ported: same manifests (the parent Service's name aside, where one
// scenario needs several parents), same requests, same expectations, and
// more checks on what the backend and client actually saw.

// testMeshBasicSplit is MeshBasic and MeshTrafficSplit: a Service without
// routes is reachable as ever (not through the proxy); with a route whose
// parentRef names no port, Exact path matches pick the backend on every
// port, the backend sees the path and Host sent, and what matches no rule
// gets 404.
func testMeshBasicSplit(s *scenario) {
	a := s.meshApps()
	s.expect(nil, call{url: httpURL(a.echo.v4(80), "/"), host: "echo"}, want{backend: "v1", direct: true})
	s.applyFile("testdata/mesh/mesh-basic-split.yaml")
	s.waitRouteStatus("HTTPRoute", s.ns, "mesh-split", "echo", routeAccepted...)
	for _, port := range []uint16{80, 8080} {
		s.waitRouted(a.echo.v4(port), "mesh-split")
		s.expect(nil, call{url: httpURL(a.echo.v4(port), "/v1"), host: "echo"}, want{backend: "v1", path: "/v1", host: "echo"})
		s.expect(nil, call{url: httpURL(a.echo.v4(port), "/v2?x=y"), host: "echo"}, want{backend: "v2", path: "/v2", query: "x=y", host: "echo"})
		s.expect(nil, call{url: httpURL(a.echo.v4(port), "/v1/more"), host: "echo"}, want{status: 404})
		s.expect(nil, call{url: httpURL(a.echo.v4(port), "/"), host: "echo"}, want{status: 404})
	}
}

// testMeshSimpleSameNamespace is MeshHTTPRouteSimpleSameNamespace: a
// route in the Service's own namespace sends a client of that namespace to
// its backendRef's port (echo-v1:8080), through the proxy.
func testMeshSimpleSameNamespace(s *scenario) {
	a := s.meshApps()
	client := s.clientPod(s.ns, "echo-v1-client")
	s.apply(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: gateway-conformance-mesh-test}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 80}]
  rules:
  - backendRefs: [{name: echo-v1, port: 8080}]
`)
	s.waitRouted(a.echo.v4(80), "gateway-conformance-mesh-test")
	s.waitRouteStatus("HTTPRoute", s.ns, "gateway-conformance-mesh-test", "echo", routeAccepted...)
	s.expect(client, call{url: httpURL(a.echo.v4(80), "/"), host: "echo"}, want{backend: "v1", path: "/", host: "echo"})
}

// testMeshConsumerRoute is MeshConsumerRoute: a route in the client's
// namespace whose parent is a Service elsewhere changes only that
// namespace's requests; stricter, a producer route on the same Service
// then governs the others while the consumer route still replaces it for
// its namespace.
func testMeshConsumerRoute(s *scenario) {
	a := s.meshApps()
	producerClient := s.clientPod(s.ns, "producer-client")
	consumer := "consumer-" + s.ns
	s.n.c.apply(s.t, s.n.clientNS, fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: %s}
spec:
  parentRefs: [{group: "", kind: Service, name: echo-v1, namespace: %s}]
  rules:
  - filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: X-Header-Set, value: set}]}
    backendRefs: [{name: echo-v1, namespace: %s, port: 80}]
`, consumer, s.ns, s.ns))
	s.waitRouted(a.echoV1.v4(80), consumer)
	s.waitRouteStatus("HTTPRoute", s.n.clientNS, consumer, "echo-v1", routeAccepted...)
	url := httpURL(a.echoV1.v4(80), "/")
	s.expect(nil, call{url: url, host: "echo-v1.gateway-conformance-mesh"},
		want{backend: "v1", respHeaders: map[string]string{"X-Header-Set": "set"}})
	s.expect(producerClient, call{url: url, host: "echo-v1.gateway-conformance-mesh"},
		want{backend: "v1", respAbsent: []string{"X-Header-Set"}})

	s.applyFile("testdata/mesh/mesh-consumer-route.yaml")
	s.waitRouted(a.echoV1.v4(80), consumer, "producer")
	s.waitRouteStatus("HTTPRoute", s.ns, "producer", "echo-v1", routeAccepted...)
	s.expect(nil, call{url: url}, want{backend: "v1", respHeaders: map[string]string{"X-Header-Set": "set"}})
	s.expect(producerClient, call{url: url}, want{backend: "v2", respHeaders: map[string]string{"X-Header-Set": "producer"}})
}

// testMeshFrontend is MeshFrontend and MeshFrontendHostname: a route
// applies to its parent Service's address only — not to the backend pod's
// own address, and by the address dialled, whatever the Host header says.
func testMeshFrontend(s *scenario) {
	a := s.meshApps()
	s.applyFile("testdata/mesh/mesh-frontend.yaml")
	s.waitRouted(a.echoV2.v4(80), "mesh-split-v1")
	s.waitRouteStatus("HTTPRoute", s.ns, "mesh-split-v1", "echo-v2", routeAccepted...)
	set := map[string]string{"X-Header-Set": "set"}
	s.expect(nil, call{url: httpURL(a.echoV2.v4(80), "/"), host: "echo-v2"}, want{backend: "v2", respHeaders: set})
	s.expect(nil, call{url: httpURL(a.v2.addr(false, meshPort), "/")}, want{backend: "v2", respAbsent: []string{"X-Header-Set"}, direct: true})
	// MeshFrontendHostname: the Service address decides, not Host.
	s.expect(nil, call{url: httpURL(a.echoV2.v4(80), "/"), host: "echo-v1"}, want{backend: "v2", host: "echo-v1", respHeaders: set})
	s.expect(nil, call{url: httpURL(a.echoV1.v4(80), "/"), host: "echo-v2"},
		want{backend: "v1", host: "echo-v2", respAbsent: []string{"X-Header-Set"}, direct: true})
}

// testMeshPorts is MeshPorts: a parentRef port limits the route to that
// Service port; without one it covers them all.
func testMeshPorts(s *scenario) {
	a := s.meshApps()
	s.applyFile("testdata/mesh/mesh-ports.yaml")
	s.waitRouted(a.echoV1.v4(80), "mesh-split-v1")
	s.waitRouted(a.echoV2.v4(80), "mesh-split-v2")
	s.waitRouted(a.echoV2.v4(8080), "mesh-split-v2")
	s.waitRouteStatus("HTTPRoute", s.ns, "mesh-split-v1", "echo-v1", routeAccepted...)
	s.waitRouteStatus("HTTPRoute", s.ns, "mesh-split-v2", "echo-v2", routeAccepted...)
	s.expect(nil, call{url: httpURL(a.echoV1.v4(80), "/"), host: "echo-v1"}, want{backend: "v1", respHeaders: map[string]string{"X-Header-Set": "v1"}})
	s.expect(nil, call{url: httpURL(a.echoV1.v4(8080), "/"), host: "echo-v1:8080"}, want{backend: "v1", respAbsent: []string{"X-Header-Set"}, direct: true})
	s.expect(nil, call{url: httpURL(a.echoV2.v4(80), "/"), host: "echo-v2"}, want{backend: "v2", respHeaders: map[string]string{"X-Header-Set": "v2"}})
	s.expect(nil, call{url: httpURL(a.echoV2.v4(8080), "/"), host: "echo-v2:8080"}, want{backend: "v2", respHeaders: map[string]string{"X-Header-Set": "v2"}})
}

// testMeshMatching is MeshHTTPRouteMatching, MeshHTTPRouteQueryParamMatching
// and MeshHTTPRouteNamedRouteRule, each route on a parent of its own (as
// upstream applies them one at a time), plus method matching.
func testMeshMatching(s *scenario) {
	a := s.meshApps()
	parents := map[string]*service{}
	for _, p := range []string{"match", "query", "named", "method"} {
		parents[p] = s.service(p, serviceSpec{Backend: a.v1, Ports: meshPorts()})
	}
	s.applyFile("testdata/mesh/mesh-matching.yaml")
	for name, route := range map[string]string{"match": "mesh-matching", "query": "mesh-query-param-matching",
		"named": "mesh-http-named-rules", "method": "mesh-method-matching"} {
		s.waitRouted(parents[name].v4(80), route)
		s.waitRouteStatus("HTTPRoute", s.ns, route, name, routeAccepted...)
	}
	m := func(path string, header map[string]string, w want) {
		s.t.Helper()
		w.path = path
		if i := strings.IndexByte(path, '?'); i >= 0 {
			w.path, w.query = path[:i], path[i+1:]
		}
		if w.status != 0 {
			w.path, w.query = "", ""
		}
		s.expect(nil, call{url: httpURL(parents["match"].v4(80), path), host: "echo", header: header}, w)
	}
	m("/", nil, want{backend: "v1"})
	m("/example", nil, want{backend: "v1"})
	m("/", map[string]string{"Version": "one"}, want{backend: "v1"})
	m("/v2", nil, want{backend: "v2"})
	m("/v2/example", nil, want{backend: "v2"})
	m("/", map[string]string{"Version": "two"}, want{backend: "v2"})
	m("/v2/", nil, want{backend: "v2"})
	m("/v2example", nil, want{backend: "v1"})
	m("/foo/v2/example", nil, want{backend: "v1"})

	q := func(path string, header map[string]string, w want) {
		s.t.Helper()
		s.expect(nil, call{url: httpURL(parents["query"].v4(80), path), host: "echo", header: header}, w)
	}
	q("/?animal=whale", nil, want{backend: "v1", query: "animal=whale"})
	q("/?animal=dolphin", nil, want{backend: "v2"})
	q("/?animal=whale&otherparam=irrelevant", nil, want{backend: "v1", query: "animal=whale&otherparam=irrelevant"})
	q("/?animal=dolphin&color=yellow", nil, want{backend: "v2"})
	q("/?color=blue", nil, want{status: 404})
	q("/?animal=dog", nil, want{status: 404})
	q("/?animal=whaledolphin", nil, want{status: 404})
	q("/", nil, want{status: 404})
	q("/path1?animal=whale", nil, want{backend: "v1", path: "/path1"})
	q("/?animal=whale", map[string]string{"version": "one"}, want{backend: "v2"})
	q("/path3?animal=shark", nil, want{backend: "v1"})
	q("/path4?animal=kraken", map[string]string{"version": "three"}, want{backend: "v1"})
	q("/?animal=shark", nil, want{status: 404})
	q("/path4?animal=kraken", nil, want{status: 404})
	q("/path5?animal=hydra", nil, want{backend: "v1"})

	s.expect(nil, call{url: httpURL(parents["named"].v4(80), "/named")}, want{backend: "v1", path: "/named"})
	s.expect(nil, call{url: httpURL(parents["named"].v4(80), "/unnamed")}, want{backend: "v2", path: "/unnamed"})
	s.n.agent.waitSnapshot(s.t, "the rule name", func(snap *snapshot.Snapshot) error {
		fe, _ := frontend(snap, parents["named"].v4(80))
		for _, r := range fe.Routes.Producer.Rules {
			if r.Name == "named-rule" && r.Index == 0 {
				return nil
			}
		}
		return fmt.Errorf("no rule named named-rule in %+v", fe.Routes.Producer.Rules)
	})

	s.expect(nil, call{method: "POST", url: httpURL(parents["method"].v4(80), "/m"), body: "x"}, want{backend: "v2", path: "/m"})
	s.expect(nil, call{url: httpURL(parents["method"].v4(80), "/m")}, want{backend: "v1", path: "/m"})
}

// testMeshRedirects is MeshHTTPRouteRedirectHostAndStatus, ...RedirectPath,
// ...RedirectPort, ...SchemeRedirect and the 303/307/308 tests, all on one
// parent (their prefixes do not overlap): the exact Location the client
// gets, query kept.
func testMeshRedirects(s *scenario) {
	a := s.meshApps()
	redirect := func(name string, rules ...string) string {
		out := fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: %s}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 80}]
  rules:
`, name)
		for i := 0; i < len(rules); i += 2 {
			out += fmt.Sprintf("  - matches: [{path: {type: PathPrefix, value: %s}}]\n    filters: [{type: RequestRedirect, requestRedirect: %s}]\n", rules[i], rules[i+1])
		}
		return out + "---\n"
	}
	s.apply(redirect("mesh-redirect-host-and-status",
		"/hostname-redirect", "{hostname: example.org}",
		"/host-and-status", "{statusCode: 301, hostname: example.org}") +
		redirect("mesh-redirect-path",
			"/original-prefix", "{path: {type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix}}",
			"/full", "{path: {type: ReplaceFullPath, replaceFullPath: /full-path-replacement}}",
			"/path-and-host", "{hostname: example.org, path: {type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix}}",
			"/path-and-status", "{path: {type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix}, statusCode: 301}",
			"/full-path-and-host", "{hostname: example.org, path: {type: ReplaceFullPath, replaceFullPath: /replacement-full}}",
			"/full-path-and-status", "{path: {type: ReplaceFullPath, replaceFullPath: /replacement-full}, statusCode: 301}") +
		redirect("mesh-redirect-port",
			"/port", "{port: 8083}",
			"/port-and-host", "{hostname: example.org, port: 8083}",
			"/port-and-status", "{port: 8083, statusCode: 301}",
			"/port-and-host-and-status", "{port: 8083, hostname: example.org, statusCode: 302}") +
		redirect("mesh-redirect-scheme",
			"/scheme", `{scheme: "https"}`,
			"/scheme-and-host", `{hostname: example.org, scheme: "https"}`,
			"/scheme-and-status", `{scheme: "https", statusCode: 301}`,
			"/scheme-and-host-and-status", `{scheme: "https", statusCode: 302, hostname: example.org}`) +
		redirect("mesh-303-redirect", "/redirect", "{statusCode: 303}") +
		redirect("mesh-307-redirect", "/temporary", "{statusCode: 307}") +
		redirect("mesh-308-redirect", "/permanent", "{statusCode: 308}"))
	routes := []string{"mesh-redirect-host-and-status", "mesh-redirect-path", "mesh-redirect-port", "mesh-redirect-scheme",
		"mesh-303-redirect", "mesh-307-redirect", "mesh-308-redirect"}
	s.waitRouted(a.echo.v4(80), routes...)
	for _, r := range routes {
		s.waitRouteStatus("HTTPRoute", s.ns, r, "echo", routeAccepted...)
	}
	for _, c := range []struct {
		path     string
		status   int
		location string
	}{
		{"/hostname-redirect", 302, "http://example.org/hostname-redirect"},
		{"/host-and-status", 301, "http://example.org/host-and-status"},
		{"/original-prefix/lemon", 302, "http://echo/replacement-prefix/lemon"},
		{"/original-prefix/lemon?x=1&y=2", 302, "http://echo/replacement-prefix/lemon?x=1&y=2"},
		{"/full/path/original", 302, "http://echo/full-path-replacement"},
		{"/path-and-host", 302, "http://example.org/replacement-prefix"},
		{"/path-and-status", 301, "http://echo/replacement-prefix"},
		{"/full-path-and-host", 302, "http://example.org/replacement-full"},
		{"/full-path-and-status", 301, "http://echo/replacement-full"},
		{"/port", 302, "http://echo:8083/port"},
		{"/port-and-host", 302, "http://example.org:8083/port-and-host"},
		{"/port-and-status", 301, "http://echo:8083/port-and-status"},
		{"/port-and-host-and-status", 302, "http://example.org:8083/port-and-host-and-status"},
		{"/scheme", 302, "https://echo/scheme"},
		{"/scheme-and-host", 302, "https://example.org/scheme-and-host"},
		{"/scheme-and-status", 301, "https://echo/scheme-and-status"},
		{"/scheme-and-host-and-status", 302, "https://example.org/scheme-and-host-and-status"},
		{"/redirect", 303, "http://echo/redirect"},
		{"/temporary", 307, "http://echo/temporary"},
		{"/permanent", 308, "http://echo/permanent"},
	} {
		s.expect(nil, call{url: httpURL(a.echo.v4(80), c.path), host: "echo"}, want{status: c.status, location: c.location})
	}
	// What no redirect matches is still 404: the routes replaced the
	// Service's own backend for HTTP.
	s.expect(nil, call{url: httpURL(a.echo.v4(80), "/elsewhere"), host: "echo"}, want{status: 404})
}

// headerModifierCases are MeshHTTPRouteRequestHeaderModifier's (and
// ...BackendRequestHeaderModifier's) requests and what the backend must
// see.
var headerModifierCases = []struct {
	path    string
	header  map[string]string
	want    map[string]string
	absent  []string
	comment string
}{
	{"/set", map[string]string{"Some-Other-Header": "val"}, map[string]string{"Some-Other-Header": "val", "X-Header-Set": "set-overwrites-values"}, nil, "set"},
	{"/set", map[string]string{"Some-Other-Header": "val", "X-Header-Set": "some-other-value"}, map[string]string{"Some-Other-Header": "val", "X-Header-Set": "set-overwrites-values"}, nil, "set overwrites"},
	{"/add", map[string]string{"Some-Other-Header": "val"}, map[string]string{"Some-Other-Header": "val", "X-Header-Add": "add-appends-values"}, nil, "add"},
	{"/add", map[string]string{"Some-Other-Header": "val", "X-Header-Add": "some-other-value"}, map[string]string{"Some-Other-Header": "val", "X-Header-Add": "some-other-value,add-appends-values"}, nil, "add appends"},
	{"/remove", map[string]string{"X-Header-Remove": "val"}, nil, []string{"X-Header-Remove"}, "remove"},
	{"/multiple", map[string]string{"X-Header-Set-2": "set-val-2", "X-Header-Add-2": "add-val-2", "X-Header-Remove-2": "remove-val-2", "Another-Header": "another-header-val"},
		map[string]string{"X-Header-Set-1": "header-set-1", "X-Header-Set-2": "header-set-2", "X-Header-Add-1": "header-add-1",
			"X-Header-Add-2": "add-val-2,header-add-2", "X-Header-Add-3": "header-add-3", "Another-Header": "another-header-val"},
		[]string{"X-Header-Remove-1", "X-Header-Remove-2"}, "multiple"},
	{"/case-insensitivity", map[string]string{"x-header-set": "original-val-set", "x-header-add": "original-val-add", "x-header-remove": "original-val-remove", "Another-Header": "another-header-val"},
		map[string]string{"X-Header-Set": "header-set", "X-Header-Add": "original-val-add,header-add", "Another-Header": "another-header-val"},
		[]string{"X-Header-Remove"}, "case insensitivity"},
}

// headerModifierRules are the rules of httproute-request-header-modifier
// .yaml, or with backendLevel of -backend.yaml (the filters on the
// backendRef).
func headerModifierRules(backendLevel bool) string {
	filters := []struct{ path, mod string }{
		{"/set", "{set: [{name: X-Header-Set, value: set-overwrites-values}]}"},
		{"/add", "{add: [{name: X-Header-Add, value: add-appends-values}]}"},
		{"/remove", "{remove: [X-Header-Remove]}"},
		{"/multiple", "{set: [{name: X-Header-Set-1, value: header-set-1}, {name: X-Header-Set-2, value: header-set-2}], " +
			"add: [{name: X-Header-Add-1, value: header-add-1}, {name: X-Header-Add-2, value: header-add-2}, {name: X-Header-Add-3, value: header-add-3}], " +
			"remove: [X-Header-Remove-1, X-Header-Remove-2]}"},
		{"/case-insensitivity", "{set: [{name: X-Header-Set, value: header-set}], add: [{name: X-Header-Add, value: header-add}], remove: [X-Header-Remove]}"},
	}
	var b strings.Builder
	for _, f := range filters {
		filter := fmt.Sprintf("[{type: RequestHeaderModifier, requestHeaderModifier: %s}]", f.mod)
		if backendLevel {
			fmt.Fprintf(&b, "  - matches: [{path: {type: PathPrefix, value: %s}}]\n    backendRefs: [{name: echo-v1, port: 8080, filters: %s}]\n", f.path, filter)
		} else {
			fmt.Fprintf(&b, "  - matches: [{path: {type: PathPrefix, value: %s}}]\n    filters: %s\n    backendRefs: [{name: echo-v1, port: 8080}]\n", f.path, filter)
		}
	}
	return b.String()
}

// testMeshRewriteAndHeaders is MeshHTTPRouteRewritePath,
// MeshHTTPRouteRequestHeaderModifier and
// MeshHTTPRouteBackendRequestHeaderModifier, each on a parent of its own,
// plus a hostname rewrite and response header changes (upstream has
// neither for mesh): what the backend saw, path and headers.
func testMeshRewriteAndHeaders(s *scenario) {
	a := s.meshApps()
	hm := s.service("hm", serviceSpec{Backend: a.v1, Ports: meshPorts()})
	bhm := s.service("bhm", serviceSpec{Backend: a.v1, Ports: meshPorts()})
	s.apply(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mesh-rewrite-path}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /prefix/one}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /one}}}]
    backendRefs: [{name: echo-v1, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /strip-prefix}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}]
    backendRefs: [{name: echo-v1, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /full/one}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /one}}}]
    backendRefs: [{name: echo-v1, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /full/rewrite-path-and-modify-headers}}]
    filters:
    - {type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /test}}}
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: X-Header-Set, value: set-overwrites-values}]
        add: [{name: X-Header-Add, value: header-val-1}, {name: X-Header-Add-Append, value: header-val-2}]
        remove: [X-Header-Remove]
    backendRefs: [{name: echo-v1, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /prefix/rewrite-path-and-modify-headers}}]
    filters:
    - {type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /prefix}}}
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: X-Header-Set, value: set-overwrites-values}]
        add: [{name: X-Header-Add, value: header-val-1}, {name: X-Header-Add-Append, value: header-val-2}]
        remove: [X-Header-Remove]
    backendRefs: [{name: echo-v1, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /host}}]
    filters: [{type: URLRewrite, urlRewrite: {hostname: rewritten.example}}]
    backendRefs: [{name: echo-v2, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /response}}]
    filters:
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        set: [{name: X-Echo, value: overwritten}]
        add: [{name: X-Added, value: added}]
        remove: [Content-Type]
    backendRefs: [{name: echo-v1, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mesh-request-header-modifier}
spec:
  parentRefs: [{group: "", kind: Service, name: hm, port: 80}]
  rules:
` + headerModifierRules(false) + `---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mesh-request-header-modifier-backend}
spec:
  parentRefs: [{group: "", kind: Service, name: bhm, port: 80}]
  rules:
` + headerModifierRules(true))
	s.waitRouted(a.echo.v4(80), "mesh-rewrite-path")
	s.waitRouted(hm.v4(80), "mesh-request-header-modifier")
	s.waitRouted(bhm.v4(80), "mesh-request-header-modifier-backend")
	s.waitRouteStatus("HTTPRoute", s.ns, "mesh-rewrite-path", "echo", routeAccepted...)
	s.waitRouteStatus("HTTPRoute", s.ns, "mesh-request-header-modifier", "hm", routeAccepted...)
	s.waitRouteStatus("HTTPRoute", s.ns, "mesh-request-header-modifier-backend", "bhm", routeAccepted...)

	url := func(p string) string { return httpURL(a.echo.v4(80), p) }
	s.expect(nil, call{url: url("/prefix/one/two"), host: "echo"}, want{backend: "v1", path: "/one/two", host: "echo"})
	s.expect(nil, call{url: url("/strip-prefix/three"), host: "echo"}, want{backend: "v1", path: "/three"})
	s.expect(nil, call{url: url("/strip-prefix"), host: "echo"}, want{backend: "v1", path: "/"})
	s.expect(nil, call{url: url("/full/one/two?q=1"), host: "echo"}, want{backend: "v1", path: "/one", query: "q=1"})
	modified := want{backend: "v1",
		headers: map[string]string{"X-Header-Add": "header-val-1", "X-Header-Add-Append": "append-val-1,header-val-2", "X-Header-Set": "set-overwrites-values"},
		absent:  []string{"X-Header-Remove"}}
	in := map[string]string{"X-Header-Remove": "remove-val", "X-Header-Add-Append": "append-val-1", "X-Header-Set": "set-val"}
	modified.path = "/test"
	s.expect(nil, call{url: url("/full/rewrite-path-and-modify-headers/test"), host: "echo", header: in}, modified)
	modified.path = "/prefix/one"
	s.expect(nil, call{url: url("/prefix/rewrite-path-and-modify-headers/one"), host: "echo", header: in}, modified)
	s.expect(nil, call{url: url("/host/x"), host: "echo"}, want{backend: "v2", path: "/host/x", host: "rewritten.example"})
	s.expect(nil, call{url: url("/response"), host: "echo", header: map[string]string{"X-Echo-Set-Header": "from-backend"}},
		want{backend: "v1", respHeaders: map[string]string{"X-Echo": "overwritten", "X-Added": "added"}, respAbsent: []string{"Content-Type"}})

	for _, parent := range []*service{hm, bhm} {
		for _, c := range headerModifierCases {
			s.expect(nil, call{url: httpURL(parent.v4(80), c.path), host: "echo", header: c.header},
				want{backend: "v1", path: c.path, headers: c.want, absent: c.absent})
		}
	}
}

// testMeshWeight is MeshHTTPRouteWeight: requests split 70/30, within
// four standard deviations, and, stricter, a weight-0 backend gets none.
func testMeshWeight(s *scenario) {
	a := s.meshApps()
	v3 := s.backend("v3", backendOptions{Wire: Plain, HTTPPort: meshPort})
	s.service("echo-v3", serviceSpec{Backend: v3, Ports: meshPorts()})
	s.applyFile("testdata/mesh/mesh-weight.yaml")
	s.waitRouted(a.echo.v4(80), "mesh-weighted-backends")
	s.waitRouteStatus("HTTPRoute", s.ns, "mesh-weighted-backends", "echo", routeAccepted...)
	const n = 300
	got := map[string]int{}
	for range n {
		r, err := s.send(nil, call{url: httpURL(a.echo.v4(80), "/"), host: "echo"})
		if err != nil || r.status != 200 {
			s.t.Fatalf("weighted request: %v %v", r, err)
		}
		got[r.report.Pod]++
	}
	// Binomial(300, 0.7): σ ≈ 7.9.
	if got["v3"] != 0 || got["v1"]+got["v2"] != n || got["v1"] < 210-32 || got["v1"] > 210+32 {
		s.t.Errorf("70/30/0 split over %d requests: %v", n, got)
	}
}

// grpcMeshBackend runs a gRPC server in a new pod of the scenario that
// answers any method with the metadata it received (JSON) and the trailer
// x-backend: name.
func (s *scenario) grpcMeshBackend(name string, port uint16) *backend {
	s.t.Helper()
	pod := s.n.newPod(s.t, s.ns, name)
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		in := new(wrapperspb.BytesValue)
		if err := st.RecvMsg(in); err != nil {
			return err
		}
		md, _ := metadata.FromIncomingContext(st.Context())
		st.SetTrailer(metadata.Pairs("x-backend", name))
		b, _ := json.Marshal(md)
		return st.SendMsg(wrapperspb.Bytes(b))
	}))
	s.listenIn(pod, port, func(l net.Listener) { srv.Serve(l) })
	s.t.Cleanup(srv.Stop)
	return &backend{pod: pod}
}

// testMeshGRPC is MeshGRPCRouteRequestHeaderModifier and
// MeshGRPCRouteWeight (h2c backends, from a gRPC client that speaks
// h2c), plus gRPC's own answer when no rule matches (UNIMPLEMENTED).
func testMeshGRPC(s *scenario) {
	const port = 7070
	grpcPorts := []servicePort{{Name: "grpc", Port: port, TargetPort: port, AppProtocol: "kubernetes.io/h2c"}}
	var backends []*backend
	for _, v := range []string{"v1", "v2", "v3"} {
		b := s.grpcMeshBackend("grpc-"+v, port)
		backends = append(backends, b)
		s.service("echo-"+v, serviceSpec{Backend: b, Ports: grpcPorts})
	}
	echoSvc := s.service("echo", serviceSpec{Backend: backends[0], Ports: grpcPorts})
	weighted := s.service("weighted", serviceSpec{Backend: backends[0], Ports: grpcPorts})
	s.applyFile("testdata/mesh/mesh-grpc.yaml")
	s.waitRouted(echoSvc.v4(port), "grpc-request-header-modifier")
	s.waitRouted(weighted.v4(port), "mesh-grpc-weighted-backends")
	s.waitRouteStatus("GRPCRoute", s.ns, "grpc-request-header-modifier", "echo", routeAccepted...)
	s.waitRouteStatus("GRPCRoute", s.ns, "mesh-grpc-weighted-backends", "weighted", routeAccepted...)

	dial := func(svc *service) *grpc.ClientConn {
		cc, err := grpc.NewClient("passthrough:///"+svc.v4(port).String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return s.n.client.dialer.DialContext(ctx, "tcp", addr)
			}))
		if err != nil {
			s.t.Fatal(err)
		}
		s.t.Cleanup(func() { cc.Close() })
		return cc
	}
	call := func(cc *grpc.ClientConn, md ...string) (metadata.MD, string, error) {
		ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), metadata.Pairs(md...)), waitFor)
		defer cancel()
		var trailer metadata.MD
		out := new(wrapperspb.BytesValue)
		err := cc.Invoke(ctx, "/grpc.testing.TestService/UnaryCall", wrapperspb.Bytes([]byte("ping")), out, grpc.Trailer(&trailer))
		var got metadata.MD
		json.Unmarshal(out.Value, &got)
		return got, strings.Join(trailer.Get("x-backend"), ","), err
	}
	cc := dial(echoSvc)
	for _, c := range []struct {
		md      []string
		backend string
		want    map[string]string
		absent  []string
	}{
		{[]string{"x-test-case", "set", "x-header-set", "some-other-value"}, "grpc-v1", map[string]string{"x-header-set": "set-overwrites-values"}, nil},
		{[]string{"x-test-case", "add", "x-header-add", "some-other-value"}, "grpc-v1", map[string]string{"x-header-add": "some-other-value,add-appends-values"}, nil},
		{[]string{"x-test-case", "remove", "x-header-remove", "val"}, "grpc-v1", nil, []string{"x-header-remove"}},
		{[]string{"x-test-case", "multi", "x-header-set-2", "set-val-2", "x-header-add-2", "add-val-2", "x-header-remove-2", "remove-val-2", "another-header", "another-header-val"},
			"grpc-v2", map[string]string{"x-header-set-1": "header-set-1", "x-header-set-2": "header-set-2", "x-header-add-1": "header-add-1",
				"x-header-add-2": "add-val-2,header-add-2", "another-header": "another-header-val"}, []string{"x-header-remove-1", "x-header-remove-2"}},
	} {
		md, backend, err := call(cc, c.md...)
		if err != nil || backend != c.backend {
			s.t.Errorf("call with %v: backend %q, %v; want %s", c.md, backend, err, c.backend)
			continue
		}
		for k, v := range c.want {
			if got := strings.Join(md.Get(k), ","); got != v {
				s.t.Errorf("call with %v: backend saw %s %q, want %q", c.md, k, got, v)
			}
		}
		for _, k := range c.absent {
			if md.Get(k) != nil {
				s.t.Errorf("call with %v: backend saw %s %v, want none", c.md, k, md.Get(k))
			}
		}
	}
	if _, _, err := call(cc); status.Code(err) != codes.Unimplemented {
		s.t.Errorf("call matching no rule: %v, want Unimplemented", err)
	}

	wc := dial(weighted)
	const n = 300
	got := map[string]int{}
	for range n {
		_, backend, err := call(wc)
		if err != nil {
			s.t.Fatalf("weighted call: %v", err)
		}
		got[backend]++
	}
	if got["grpc-v3"] != 0 || got["grpc-v1"]+got["grpc-v2"] != n || got["grpc-v1"] < 210-32 || got["grpc-v1"] > 210+32 {
		s.t.Errorf("70/30/0 gRPC split over %d calls: %v", n, got)
	}
}
