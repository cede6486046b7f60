package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/sockmesh/sockmesh/agent/enrol"
	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/agentproc"
	"github.com/sockmesh/sockmesh/internal/nodetopo"
	"github.com/sockmesh/sockmesh/internal/nshttp"
	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/test/echo"
)

// demoCase is one Service the client calls and what its backend must see.
type demoCase struct {
	service  string // the Service's name in namespace demo
	declared string // which object declares the wire, for the reader
	vip      netip.AddrPort
	path     string
	ws       bool
	// The backend: where sockmesh-echo listens, and with what TLS.
	backendPod   string
	backendPort  uint16
	serverName   string // TLS server name; empty: cleartext
	mutualTLS    bool
	externalHost string // resolved by the demo's DNS to the backend
	// want checks the backend's report and returns what is wrong.
	want func(echo.Report) []string
}

// loadCases reads the four scenarios' addresses, ports and names from the
// example manifests, so the demo follows them when they change.
func loadCases(m *manifests) ([]*demoCase, error) {
	payments := &demoCase{service: "payments", path: "/checkout", backendPod: "payments-0",
		declared: "BackendTLSPolicy demo/payments (TLS, CA from ConfigMap payments-ca)"}
	partner := &demoCase{service: "partner", path: "/quote", backendPod: "partner-api", mutualTLS: true,
		declared: "XBackend demo/partner-api (external hostname, mutual TLS, HTTP/2)"}
	grpc := &demoCase{service: "grpc", path: "/hello", backendPod: "grpc-0",
		declared: "appProtocol kubernetes.io/h2c on Service demo/grpc"}
	chat := &demoCase{service: "chat", path: "/ws", backendPod: "chat-0", ws: true,
		declared: "appProtocol kubernetes.io/ws on Service demo/chat"}

	var errs []error
	must := func(err error) { errs = append(errs, err) }
	var err error
	payments.vip, payments.backendPort, err = m.servicePort(demoNamespace, "payments", "payments-demo")
	must(err)
	payments.serverName, err = m.str("BackendTLSPolicy", demoNamespace, "payments", "spec", "validation", "hostname")
	must(err)
	partner.vip, _, err = m.servicePort(demoNamespace, "partner", "")
	must(err)
	partner.externalHost, err = m.str("XBackend", demoNamespace, "partner-api", "spec", "externalHostname", "hostname")
	must(err)
	partner.serverName, err = m.str("XBackend", demoNamespace, "partner-api", "spec", "tls", "validation", "hostname")
	must(err)
	partner.backendPort, err = m.port("XBackend", demoNamespace, "partner-api", "spec", "port", "number")
	must(err)
	grpc.vip, grpc.backendPort, err = m.servicePort(demoNamespace, "grpc", "grpc-demo")
	must(err)
	chat.vip, chat.backendPort, err = m.servicePort(demoNamespace, "chat", "chat-demo")
	must(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	payments.want = func(r echo.Report) []string {
		return checks(
			expectTLS(r, payments.serverName),
			expect(r.Proto == "HTTP/1.1", "protocol %s, want HTTP/1.1", r.Proto))
	}
	partner.want = func(r echo.Report) []string {
		p := checks(expectTLS(r, partner.serverName),
			expect(r.Proto == "HTTP/2.0", "protocol %s, want HTTP/2.0", r.Proto))
		if r.TLS != nil {
			p = append(p, checks(
				expect(r.TLS.NegotiatedProtocol == "h2", "ALPN %q, want h2", r.TLS.NegotiatedProtocol),
				expect(len(r.TLS.PeerCertificates) > 0 && strings.Contains(r.TLS.PeerCertificates[0].Subject, clientCN),
					"no client certificate %s", clientCN))...)
		}
		return p
	}
	grpc.want = func(r echo.Report) []string {
		return checks(
			expect(r.TLS == nil, "TLS, want cleartext"),
			expect(r.Proto == "HTTP/2.0", "protocol %s, want HTTP/2.0 (h2c)", r.Proto))
	}
	chat.want = func(r echo.Report) []string {
		return checks(
			expect(r.TLS == nil, "TLS, want cleartext"),
			expect(strings.EqualFold(r.Headers.Get("Upgrade"), "websocket"), "no WebSocket upgrade"))
	}
	return []*demoCase{payments, partner, grpc, chat}, nil
}

func expect(ok bool, format string, args ...any) string {
	if ok {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

func expectTLS(r echo.Report, serverName string) string {
	switch {
	case r.TLS == nil:
		return "plaintext, want TLS"
	case r.TLS.ServerName != serverName:
		return fmt.Sprintf("SNI %q, want %q", r.TLS.ServerName, serverName)
	}
	return ""
}

func checks(problems ...string) []string {
	var out []string
	for _, p := range problems {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// result is one case's outcome.
type result struct {
	c      *demoCase
	sent   string
	report echo.Report
	echoed string // the WebSocket message that came back
	err    error
}

// servedWithin bounds the wait for the agent to serve every case; the
// first Snapshot may come before the DNS answer for the external hostname,
// and the next one follows within a moment.
const servedWithin = 30 * time.Second

// runCases calls each Service from the client pod once the agent serves
// what the case needs (waitServed), all within servedWithin of the start
// and ctx; a case the agent never serves fails with what it waited for.
func runCases(ctx context.Context, ag *agentproc.Agent, client *sandbox.NetNS, cases []*demoCase) []result {
	ctx, cancel := context.WithTimeout(ctx, servedWithin)
	defer cancel()
	var out []result
	for _, c := range cases {
		if err := waitServed(ctx, ag, c); err != nil {
			out = append(out, result{c: c, err: err})
			continue
		}
		out = append(out, runCase(ctx, client, c))
	}
	return out
}

// waitServed polls the agent's introspection report until the Snapshot it
// serves captures c's Service address with a valid backend that has an
// endpoint to dial (for the XBackend: its vetted DNS answer), and the
// client pod is enrolled: then the case's one call must pass.
func waitServed(ctx context.Context, ag *agentproc.Agent, c *demoCase) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := served(ag, c)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waited for the agent to serve %s %s with a backend to dial and pod %s/client enrolled: still %w (%w)",
				c.service, c.vip, demoNamespace, err, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// served says what the agent's report still lacks for c, or nil.
func served(ag *agentproc.Agent, c *demoCase) error {
	rep, err := ag.Report()
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(rep.Pods, func(p enrol.Pod) bool {
		return p.Pod.Namespace == demoNamespace && p.Pod.Name == "client" && p.State == enrol.Enrolled
	}) {
		return errors.New("client pod not enrolled")
	}
	snap := rep.Snapshot
	if snap == nil {
		return errors.New("no Snapshot applied")
	}
	i := slices.IndexFunc(snap.Frontends, func(fe snapshot.Frontend) bool {
		return fe.Port == c.vip.Port() && slices.Contains(fe.Addresses, c.vip.Addr())
	})
	if i < 0 {
		return errors.New("not captured")
	}
	// Linear: a decoded Snapshot has no index (snapshot.New builds it).
	ref := snap.Frontends[i].Backend
	j := slices.IndexFunc(snap.Backends, func(b snapshot.Backend) bool { return b.Ref == ref })
	if j < 0 {
		return fmt.Errorf("captured, backend %s missing", ref)
	}
	switch be := &snap.Backends[j]; {
	case be.Invalid != nil:
		return fmt.Errorf("backend %s invalid: %s: %s", be.Ref, be.Invalid.Reason, be.Invalid.Message)
	case !slices.ContainsFunc(be.Endpoints, func(e snapshot.Endpoint) bool { return e.Ready }):
		return fmt.Errorf("backend %s has no ready endpoint", be.Ref)
	}
	return nil
}

func runCase(ctx context.Context, client *sandbox.NetNS, c *demoCase) result {
	r := result{c: c}
	if c.ws {
		r.sent = fmt.Sprintf("ws://%s%s  HTTP/1.1 Upgrade: websocket, plaintext", c.vip, c.path)
		r.report, r.echoed, r.err = callWebSocket(ctx, client, "ws://"+c.vip.String()+c.path)
	} else {
		r.sent = fmt.Sprintf("GET http://%s%s  HTTP/1.1, plaintext", c.vip, c.path)
		r.report, r.err = callHTTP(ctx, client, "http://"+c.vip.String()+c.path)
	}
	if r.err == nil {
		if problems := c.want(r.report); len(problems) > 0 {
			r.err = fmt.Errorf("%s", strings.Join(problems, "; "))
		}
	}
	return r
}

func callHTTP(ctx context.Context, client *sandbox.NetNS, url string) (echo.Report, error) {
	var rep echo.Report
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return rep, err
	}
	resp, err := nshttp.Client(client, 5*time.Second).Do(req)
	if err != nil {
		return rep, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return rep, err
	}
	if resp.StatusCode != http.StatusOK {
		return rep, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, &rep); err != nil {
		return rep, fmt.Errorf("decode the backend's report: %w", err)
	}
	return rep, nil
}

// wsMessage is what the client sends over the WebSocket.
const wsMessage = "hello through sockmesh"

func callWebSocket(ctx context.Context, client *sandbox.NetNS, url string) (echo.Report, string, error) {
	var rep echo.Report
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// No Client.Timeout: the WebSocket library refuses one (it bounds the
	// whole connection); ctx bounds the exchange.
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: &http.Client{Transport: nshttp.Transport(client)}})
	if err != nil {
		return rep, "", err
	}
	defer c.CloseNow()
	_, first, err := c.Read(ctx)
	if err != nil {
		return rep, "", fmt.Errorf("read the backend's report: %w", err)
	}
	if err := json.Unmarshal(first, &rep); err != nil {
		return rep, "", fmt.Errorf("decode the backend's report: %w", err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(wsMessage)); err != nil {
		return rep, "", err
	}
	_, back, err := c.Read(ctx)
	if err != nil {
		return rep, "", fmt.Errorf("read the echo: %w", err)
	}
	if string(back) != wsMessage {
		return rep, string(back), fmt.Errorf("echo %q, want %q", back, wsMessage)
	}
	c.Close(websocket.StatusNormalClosure, "")
	return rep, string(back), nil
}

// saw describes what the backend saw.
func (r result) saw() string {
	rep := r.report
	s := fmt.Sprintf("%s %s  %s", rep.Method, rep.Path, rep.Proto)
	if r.c.ws {
		s += " Upgrade: " + rep.Headers.Get("Upgrade")
	}
	if rep.TLS == nil {
		s += ", cleartext"
		if rep.Proto == "HTTP/2.0" {
			s += " (h2c)"
		}
	} else {
		s += " in " + rep.TLS.Version + ", SNI " + rep.TLS.ServerName
		if rep.TLS.NegotiatedProtocol != "" {
			s += ", ALPN " + rep.TLS.NegotiatedProtocol
		}
		if len(rep.TLS.PeerCertificates) > 0 {
			s += ", client cert " + rep.TLS.PeerCertificates[0].Subject
		}
	}
	if r.echoed != "" {
		s += fmt.Sprintf("; message %q echoed", r.echoed)
	}
	return s
}

func printIntro(w io.Writer, topo *nodetopo.Topology, cases []*demoCase, args []string) {
	var servers []string
	for _, c := range cases {
		kind := "cleartext"
		switch {
		case c.mutualTLS:
			kind = "mutual TLS"
		case c.serverName != "":
			kind = "TLS"
		}
		server := fmt.Sprintf(":%d %s (%s)", c.backendPort, c.service, kind)
		if c.externalHost != "" {
			server = fmt.Sprintf("%s:%d %s (%s, outside the cluster)", c.listenAddr(), c.backendPort, c.service, kind)
		}
		servers = append(servers, server)
	}
	fmt.Fprintf(w, `sockmesh demo: an app speaks plaintext HTTP/1.1 to Service addresses; sockmesh makes
each wire what the backend's owner declared. Three network namespaces stand in for a node:

  node     %-14s the agent: eBPF programs, proxy on %s, the example manifests
  client   %-14s pod demo/client, %s, enrolled by the agent (no sidecar, no change)
  backend  %-14s %s, sockmesh-echo servers that report what they received:
                          %s

  sockmesh %s

`, topo.Node.Name, netip.AddrPortFrom(addrs.Node, proxyPort), topo.Client.Name, addrs.Client.Addr(),
		topo.Backend.Name, addrs.Backend.Addr(), strings.Join(servers, ", "), strings.Join(args, " "))
}

func printResults(w io.Writer, results []result) {
	for _, r := range results {
		mark := "PASS"
		if r.err != nil {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "[%s] %s, declared by %s\n", mark, r.c.service, r.c.declared)
		fmt.Fprintf(w, "       client sent   %s\n", r.sent)
		if r.report.Proto != "" {
			fmt.Fprintf(w, "       backend saw   %s\n", r.saw())
		}
		if r.err != nil {
			fmt.Fprintf(w, "       problem       %v\n", r.err)
		}
	}
	fmt.Fprintln(w)
}

func printSummary(w io.Writer, results []result, redirected uint64) {
	passed := 0
	for _, r := range results {
		if r.err == nil {
			passed++
		}
	}
	fmt.Fprintf(w, `%d of %d backends saw what their owners declared. The app never changed: the eBPF connect
hook sent its connections to the proxy (sockmesh_datapath_redirects_total{decision="redirected"} %d),
which originated TLS, spoke h2c or carried the WebSocket, as each Service's policy said.

`, passed, len(results), redirected)
}

// redirects reads the datapath's redirect counter from the agent's metrics.
func redirects(node *sandbox.NetNS) (uint64, error) {
	resp, err := nshttp.Client(node, 5*time.Second).Get("http://" + healthAddr + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("scrape the agent's metrics: %w", err)
	}
	defer resp.Body.Close()
	const series = `sockmesh_datapath_redirects_total{decision="redirected"} `
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s: %w", series, err)
			}
			return uint64(f), nil
		}
	}
	return 0, fmt.Errorf("the agent's metrics have no %s", strings.TrimSpace(series))
}

// listenAddr is where c's backend listens: an external host's address
// apart from the in-cluster pods' one.
func (c *demoCase) listenAddr() netip.Addr {
	if c.externalHost != "" {
		return externalAddr
	}
	return addrs.Backend.Addr()
}
