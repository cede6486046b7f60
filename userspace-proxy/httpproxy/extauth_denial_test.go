package httpproxy

import (
	"net/http"
	"strings"
	"testing"
)

// TestGRPCDenial: a denial to a gRPC call becomes a trailers-only answer
// whose status is gRPC's reading of the HTTP status and whose message is
// the body, percent-encoded as grpc-message asks ('%' and bytes outside
// printable ASCII), trimmed, and cut at grpcMessageLimit; an empty body
// names the reason.
func TestGRPCDenial(t *testing.T) {
	for _, tt := range []struct {
		status    int
		body      string
		code, msg string
	}{
		{401, "token expired\n", "16", "token expired"},
		{403, "100% denied: café", "7", "100%25 denied: caf%C3%A9"},
		{404, "", "12", "sockmesh: ext_auth_denied"},
		{400, "bad", "13", "bad"},
		{429, "slow down", "14", "slow down"},
		{503, "x", "14", "x"},
		{418, "teapot", "2", "teapot"},
		{302, strings.Repeat("a", 2*grpcMessageLimit), "2", strings.Repeat("a", grpcMessageLimit)},
	} {
		a := localAnswer{status: tt.status, header: http.Header{"Www-Authenticate": {"Bearer"}, "Content-Type": {"text/plain"}}, body: []byte(tt.body)}
		grpcDenial(&a)
		h := a.header
		if a.status != http.StatusOK || !a.grpc || a.body != nil || h.Get("Grpc-Status") != tt.code || h.Get("Grpc-Message") != tt.msg ||
			h.Get("Content-Type") != "application/grpc" || h.Get("Www-Authenticate") != "Bearer" {
			t.Errorf("%d %q: status %d grpc %v body %q header %v; want 200, trailers-only, grpc-status %s, grpc-message %q, the server's headers",
				tt.status, tt.body, a.status, a.grpc, a.body, h, tt.code, tt.msg)
		}
	}
}
