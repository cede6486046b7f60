package proxy_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/tlsrefusal"
	"github.com/sockmesh/sockmesh/test/echo"
	"github.com/sockmesh/sockmesh/userspace-proxy/proxy"
)

// TestClientCertificateRefused: a backend that refuses the client
// certificate of its TLS settings (signed by a CA it does not trust) fails
// every app the way failures.md says of a failed handshake, over TLS 1.3
// and 1.2, whichever way a TLS 1.3 refusal comes (tlsrefusal: the alert
// on the proxy's first read, or behind the reset that broke its first
// write): an HTTP app's request 502 tls_handshake on the L7 paths, a gRPC
// app's call UNAVAILABLE tls_handshake (its connection relayed, the
// backend's answer to the preface tells), and a relayed connection (an
// HTTP app's on the L4 path, opaque TCP) a reset, counted and logged as a
// failed handshake naming the backend's alert.
func TestClientCertificateRefused(t *testing.T) {
	checkNoLeaks(t)
	for _, backendFirst := range []bool{false, true} {
		for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
			order := map[bool]string{false: "proxy writes first", true: "backend resets first"}[backendFirst]
			for _, path := range []proxy.HTTP1TLSPath{proxy.HTTP1TLSL7, proxy.HTTP1TLSL4, proxy.HTTP1TLSPooled} {
				t.Run(fmt.Sprintf("%s/%s/path=%d", order, tls.VersionName(version), path), func(t *testing.T) {
					r := &tlsrefusal.Refusal{BackendFirst: backendFirst}
					e := newEnv(t, envOptions{http1TLS: path, dialer: r.Dialer})
					refusing := r.Serve(t, requireClientFrom(e.pki))
					vWeb, vDB, vGRPC := netip.MustParseAddrPort("10.96.9.1:80"), netip.MustParseAddrPort("10.96.9.2:5432"), netip.MustParseAddrPort("10.96.9.3:9000")
					pol := tlsPolicy(e)
					pol.Mode, pol.ClientCertificatePEM, pol.ClientKeyPEM = snapshot.TLSMutual, string(e.pki.otherClient.CertPEM), string(e.pki.otherClient.KeyPEM)
					pol.MaxVersion = version
					e.p.Update(buildSnapshot(t, 1,
						service{name: "web", vip: vWeb, backend: snapshot.Backend{TLS: pol, Endpoints: endpoints(refusing)}},
						service{name: "db", vip: vDB, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: pol, Endpoints: endpoints(refusing)}},
						service{name: "grpc", vip: vGRPC, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: pol, Endpoints: endpoints(refusing)}},
					))
					relayed := map[string]string{"reason": "tls_handshake"} // connection_failures_total's
					resp, err := e.client(vWeb, false).Get("http://web.b.svc/")
					if path == proxy.HTTP1TLSL4 && version == tls.VersionTLS13 {
						// Relayed once the proxy's handshake ended: the
						// app's connection is reset.
						if err == nil {
							resp.Body.Close()
							t.Errorf("HTTP app on the L4 path: status %d, want its connection reset", resp.StatusCode)
						}
						relayed["path"] = "l4_tls"
						if n := e.counterReaches("sockmesh_proxy_connection_failures_total", relayed, 1); n != 1 {
							t.Errorf("connection_failures_total%v = %v, want 1", relayed, n)
						}
					} else {
						if err != nil {
							t.Fatalf("HTTP app: %v, want a 502", err)
						}
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "sockmesh: tls_handshake") {
							t.Errorf("HTTP app: %d %q, want 502 sockmesh: tls_handshake", resp.StatusCode, body)
						}
					}

					c, err := e.dial(vDB)
					if err != nil {
						t.Fatal(err)
					}
					c.Write([]byte("opaque"))
					if b, err := io.ReadAll(c); err == nil || len(b) > 0 {
						t.Errorf("TCP app: read %q, %v; want its connection reset", b, err)
					}
					c.Close()
					relayed["path"] = "l4_tls"
					want := map[bool]float64{false: 1, true: 2}[path == proxy.HTTP1TLSL4 && version == tls.VersionTLS13]
					if n := e.counterReaches("sockmesh_proxy_connection_failures_total", relayed, want); n != want {
						t.Errorf("connection_failures_total%v = %v, want %v", relayed, n, want)
					}

					cc := e.grpcClient(t, "grpc.b.svc:9000", vGRPC)
					defer cc.Close()
					err = cc.Invoke(context.Background(), echo.MethodUnary, wrapperspb.Bytes([]byte("ping")), new(wrapperspb.BytesValue))
					if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "sockmesh: tls_handshake" {
						t.Errorf("gRPC app: %v; want code Unavailable, message sockmesh: tls_handshake", err)
					}

					if logs := e.logs.String(); !strings.Contains(logs, "remote error: tls: unknown certificate authority") {
						t.Errorf("no failure naming the backend's alert in the log:\n%s", logs)
					}
				})
			}
		}
	}
}

// requireClientFrom is the backend TLS of s's server certificate, which
// requires a client certificate that s's CA issued, and speaks h2 and
// http/1.1.
func requireClientFrom(s *pkiSet) *tls.Config {
	c := serverTLS(s.server)
	c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, s.ca.Pool()
	c.NextProtos = []string{"h2", "http/1.1"}
	return c
}

// TestClientCertificateClosedWithoutAlert: a backend that asked for a
// client certificate and then closes without an alert before its first
// word (upstream.TestClientCertificateClosedWithoutAlert says why that is
// no refusal the proxy can tell) fails every app as a backend that closed
// unanswered, on every path, over TLS 1.3 as over 1.2: an HTTP app's
// request 502 upstream_error on the L7 paths, its connection ended on the
// L4 path, a TCP app's connection ended, a gRPC app's call UNAVAILABLE —
// none of them told tls_handshake — and every handshake counts as full,
// none as failed.
func TestClientCertificateClosedWithoutAlert(t *testing.T) {
	checkNoLeaks(t)
	for _, o := range []struct{ backendFirst, fin bool }{{true, true}, {true, false}, {false, false}} {
		ending := map[bool]string{false: "reset", true: "fin"}[o.fin] + map[bool]string{false: " after the proxy wrote", true: " first"}[o.backendFirst]
		for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
			for _, path := range []proxy.HTTP1TLSPath{proxy.HTTP1TLSL7, proxy.HTTP1TLSL4, proxy.HTTP1TLSPooled} {
				t.Run(fmt.Sprintf("%s/%s/path=%d", ending, tls.VersionName(version), path), func(t *testing.T) {
					r := &tlsrefusal.Refusal{Silent: true, BackendFirst: o.backendFirst, FIN: o.fin}
					e := newEnv(t, envOptions{http1TLS: path, dialer: r.Dialer})
					cfg := requireClientFrom(e.pki)
					cfg.SessionTicketsDisabled = true // each handshake asks for the certificate
					closing := r.Serve(t, cfg)
					vWeb, vDB, vGRPC := netip.MustParseAddrPort("10.96.9.1:80"), netip.MustParseAddrPort("10.96.9.2:5432"), netip.MustParseAddrPort("10.96.9.3:9000")
					pol := tlsPolicy(e)
					pol.Mode, pol.ClientCertificatePEM, pol.ClientKeyPEM = snapshot.TLSMutual, string(e.pki.otherClient.CertPEM), string(e.pki.otherClient.KeyPEM)
					pol.MaxVersion = version
					e.p.Update(buildSnapshot(t, 1,
						service{name: "web", vip: vWeb, backend: snapshot.Backend{TLS: pol, Endpoints: endpoints(closing)}},
						service{name: "db", vip: vDB, backend: snapshot.Backend{Protocol: snapshot.ProtocolTCP, TLS: pol, Endpoints: endpoints(closing)}},
						service{name: "grpc", vip: vGRPC, backend: snapshot.Backend{Protocol: snapshot.ProtocolGRPC, TLS: pol, Endpoints: endpoints(closing)}},
					))
					resp, err := e.client(vWeb, false).Get("http://web.b.svc/")
					if path == proxy.HTTP1TLSL4 {
						if err == nil {
							resp.Body.Close()
							t.Errorf("HTTP app on the L4 path: status %d, want its connection ended", resp.StatusCode)
						}
					} else {
						if err != nil {
							t.Fatalf("HTTP app: %v, want a 502", err)
						}
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "sockmesh: upstream_error") {
							t.Errorf("HTTP app: %d %q, want 502 sockmesh: upstream_error", resp.StatusCode, body)
						}
					}

					c, err := e.dial(vDB)
					if err != nil {
						t.Fatal(err)
					}
					c.Write([]byte("opaque"))
					if b, err := io.ReadAll(c); len(b) > 0 {
						t.Errorf("TCP app: read %q, %v; want its connection ended", b, err)
					}
					c.Close()

					cc := e.grpcClient(t, "grpc.b.svc:9000", vGRPC)
					defer cc.Close()
					err = cc.Invoke(context.Background(), echo.MethodUnary, wrapperspb.Bytes([]byte("ping")), new(wrapperspb.BytesValue))
					if st := status.Convert(err); st.Code() != codes.Unavailable || strings.Contains(st.Message(), "tls_handshake") {
						t.Errorf("gRPC app: %v; want code Unavailable, not tls_handshake", err)
					}

					// One handshake for each app at least, each counted
					// once settled, the relays' after they ended.
					const handshakes = "sockmesh_proxy_upstream_tls_handshakes_total"
					if n := e.counterReaches(handshakes, map[string]string{"result": "full"}, 3); n < 3 {
						t.Errorf("%s{result=full} = %v, want 3 at least", handshakes, n)
					}
					if n := e.counter(handshakes, map[string]string{"result": "failed"}); n != 0 {
						t.Errorf("%s{result=failed} = %v, want 0", handshakes, n)
					}
					if n := e.counter("sockmesh_proxy_connection_failures_total", map[string]string{"reason": "tls_handshake"}); n != 0 {
						t.Errorf("connection_failures_total{reason=tls_handshake} = %v, want 0", n)
					}
					if logs := e.logs.String(); strings.Contains(logs, "refused by the backend") {
						t.Errorf("a refusal in the log:\n%s", logs)
					}
				})
			}
		}
	}
}
