package proxy_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sockmesh/sockmesh/agent/snapshot"
)

// helloLog records the ALPN lists of the ClientHellos a TLS server got.
type helloLog struct {
	mu     sync.Mutex
	offers [][]string
}

func (l *helloLog) add(protos []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.offers = append(l.offers, slices.Clone(protos))
}

// take returns the offers recorded since the last take.
func (l *helloLog) take() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.offers
	l.offers = nil
	return o
}

// strictH2 makes cfg, an h2-only server's, refuse an offer without h2 with
// TLS alert no_application_protocol, as rustls does (and Netty with
// FATAL_ALERT): crypto/tls lets an offer of http/1.1 through with no
// protocol picked to a server that names h2 alone (Go issue 46310). It
// records each hello's offer in log.
func strictH2(cfg *tls.Config, log *helloLog) {
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		log.add(hello.SupportedProtos)
		if slices.Contains(hello.SupportedProtos, "h2") {
			return nil, nil
		}
		c := cfg.Clone()
		c.GetConfigForClient = nil
		c.NextProtos = []string{"h2-only"} // no h2 to fall back from: the alert
		return c, nil
	}
}

// TestH2OnlyBackend: an HTTP/1.1 app's requests (fast path and net/http's)
// to an XBackend of protocol HTTP over TLS, whose ALPN offers h2 and
// http/1.1, reach a server that speaks h2 alone over h2 — the first one,
// whose offer of http/1.1 alone on the fast path the server refused
// (no_application_protocol), with its fields and body (read plain; a GET
// or a POST), and the later ones, which
// offer both at once (one hello each, h2 in it); they failed 502
// tls_handshake before. A server that speaks HTTP/1.1 alone, or both,
// still takes the fast path's HTTP/1.1 (net/http's path negotiates h2
// with the latter), and one that refuses the proxy's handshake for a
// missing client certificate (TLS 1.2: within it) still fails every
// request 502 tls_handshake, each after one hello offering http/1.1
// alone on the fast path, as does the h2-only server behind a backend
// declared HTTP11 (offered http/1.1 alone by both paths, never h2).
func TestH2OnlyBackend(t *testing.T) {
	checkNoLeaks(t)
	for _, k := range http1Kinds {
		t.Run(k.name, func(t *testing.T) {
			e := newEnv(t, envOptions{http1TLS: k.path})
			m := &mesh{t: t}
			names := []string{"h2-only", "h2-only-get", "h1-only", "both", "bad-cert", "h1-declared"}
			vips := map[string]netip.AddrPort{}
			hellos := map[string]*helloLog{}
			for i, name := range names {
				hs := &http.Server{Protocols: new(http.Protocols), TLSConfig: serverTLS(e.pki.server),
					Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						b, _ := io.ReadAll(r.Body)
						fmt.Fprintf(w, "%s %s %s %s", r.Proto, r.Method, r.Header.Get("X-App"), b)
					})}
				hs.Protocols.SetHTTP1(!strings.HasPrefix(name, "h2-only") && name != "h1-declared")
				hs.Protocols.SetHTTP2(name != "h1-only")
				log := new(helloLog)
				hellos[name] = log
				switch name {
				case "h2-only", "h2-only-get", "h1-declared":
					hs.TLSConfig.NextProtos = []string{"h2"}
					strictH2(hs.TLSConfig, log)
				case "h1-only":
					hs.TLSConfig.NextProtos = []string{"http/1.1"}
				case "bad-cert":
					hs.TLSConfig.MaxVersion = tls.VersionTLS12
					hs.TLSConfig.ClientAuth = tls.RequireAnyClientCert
					hs.TLSConfig.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
						log.add(hello.SupportedProtos)
						return nil, nil
					}
				}
				be := snapshot.Backend{Protocol: snapshot.ProtocolHTTP, TLS: tlsPolicy(e), Endpoints: endpoints(serveLocal(t, hs))}
				if name == "h1-declared" {
					be.Protocol = snapshot.ProtocolHTTP11 // never offered h2
				}
				vips[name] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 49, byte(i + 1)}), 80)
				m.frontend(name, vips[name], m.backend(name, be), nil)
			}
			e.p.Update(m.snapshot(1))
			for name, methods := range map[string][]string{"h2-only": {"POST", "GET", "POST", "GET"}, "h2-only-get": {"GET", "POST", "GET"}} {
				c := e.client(vips[name], false)
				for i, method := range methods {
					want := "HTTP/2.0 " + method + " app "
					var body io.Reader
					if method == "POST" {
						body = strings.NewReader(fmt.Sprint("body-", i))
						want += fmt.Sprint("body-", i)
					}
					if got := ask(t, c, method, "http://"+name+".b.svc/", body); got != want {
						t.Errorf("%s: request %d: %q, want 200 %q", name, i, got, want)
					}
					offers := hellos[name].take()
					if k.name == "http1-fast" && i == 0 {
						// The fast path's offer, refused, then the negotiation's.
						if len(offers) != 2 || !slices.Equal(offers[0], []string{"http/1.1"}) || !slices.Contains(offers[1], "h2") {
							t.Errorf("%s: first request's hellos offered %q, want [http/1.1] then one with h2", name, offers)
						}
					} else if len(offers) > 1 || len(offers) == 1 && !slices.Contains(offers[0], "h2") {
						t.Errorf("%s: request %d's hellos offered %q, want at most one, with h2", name, i, offers)
					}
				}
			}
			for _, name := range []string{"h1-only", "both"} {
				wire := "HTTP/1.1"
				if name == "both" && k.name == "http1-nethttp" {
					wire = "HTTP/2.0"
				}
				c := e.client(vips[name], false)
				for i, method := range []string{"GET", "POST"} {
					want := wire + " " + method + " app "
					var body io.Reader
					if method == "POST" {
						body, want = strings.NewReader("b"), want+"b"
					}
					if got := ask(t, c, method, "http://"+name+".b.svc/", body); got != want {
						t.Errorf("%s: request %d: %q, want 200 %q", name, i, got, want)
					}
				}
			}
			failed := map[string]string{"reason": "tls_handshake"}
			before := e.counter("sockmesh_proxy_request_failures_total", failed)
			for _, name := range []string{"bad-cert", "h1-declared"} {
				c := e.client(vips[name], false)
				for i := range 2 {
					if got := ask(t, c, "GET", "http://"+name+".b.svc/", nil); !strings.HasPrefix(got, "502 ") {
						t.Errorf("%s: request %d: %q, want 502", name, i, got)
					}
					offers := hellos[name].take()
					if (k.name == "http1-fast" || name == "h1-declared") && (len(offers) != 1 || !slices.Equal(offers[0], []string{"http/1.1"})) {
						t.Errorf("%s: request %d's hellos offered %q, want one of http/1.1 alone", name, i, offers)
					}
				}
			}
			if n := e.counterReaches("sockmesh_proxy_request_failures_total", failed, before+4); n != before+4 {
				t.Errorf("request_failures_total%v = %v, want %v", failed, n, before+4)
			}
		})
	}
}

// ask sends a request with the field X-App: app and returns "PROTO METHOD
// X-APP BODY" as TestH2OnlyBackend's servers answer for a 200, else the
// status and body.
func ask(t *testing.T, c *http.Client, method, url string, body io.Reader) string {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-App", "app")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	return string(b)
}
