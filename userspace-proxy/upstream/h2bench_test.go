package upstream

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockmesh/sockmesh/userspace-proxy/dial"
)

// BenchmarkH2RoundTrip: a GET through net/http's HTTP/2 Transport to an
// h2c backend on loopback, its answer read.
func BenchmarkH2RoundTrip(b *testing.B) {
	addr, _ := startH2C(b, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, "ok") }), 0)
	pools, err := New(Config{}, dial.NewDirect(dial.Config{Unmarked: true}), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	be := backendAt(b, pools, addr, nil)
	rt := be.RoundTripper(WireH2)
	b.ReportAllocs()
	for b.Loop() {
		resp, err := rt.RoundTrip(benchRequest(b, b.Context(), be, http.MethodGet, "/", nil))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkH2StreamWait: what the bound on a request's wait for a stream
// costs it, from the connection it was given (GotConn) to its HEADERS
// written (WroteHeaders).
func BenchmarkH2StreamWait(b *testing.B) {
	addr, _ := startH2C(b, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {}), 0)
	pools, err := New(Config{}, dial.NewDirect(dial.Config{Unmarked: true}), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	be := backendAt(b, pools, addr, nil)
	var conn httptrace.GotConnInfo
	req := benchRequest(b, httptrace.WithClientTrace(b.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conn = i }}), be, http.MethodGet, "/", nil)
	resp, err := be.RoundTripper(WireH2).RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	_, try := be.w.traceConn(benchRequest(b, b.Context(), be, http.MethodGet, "/", nil))
	_, try.cancel = context.WithCancelCause(b.Context())
	b.ReportAllocs()
	for b.Loop() {
		try.trace.GotConn(conn)
		try.trace.WroteHeaders()
		try.sent = 0
	}
}

// benchRequest is request's, for a benchmark.
func benchRequest(b *testing.B, ctx context.Context, be *Backend, method, path string, body io.Reader) *http.Request {
	u := &url.URL{Scheme: be.Scheme(), Host: be.Spec.Endpoints[0].Addr.String(), Path: path}
	req, err := http.NewRequestWithContext(WithEndpoint(ctx, be.Picker.Pick()), method, u.String(), body)
	if err != nil {
		b.Fatal(err)
	}
	return req
}
