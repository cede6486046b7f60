package httpproxy

import (
	"net/http"
	"strconv"
	"time"
)

// A gRPC call the proxy bounds (a rule's timeouts.request, or
// backendRequest for each try) goes to its backend with a grpc-timeout no
// later than that bound: the app's, when it sent a shorter one, else what
// is left of the bound as the try goes. Passed on as the app sent it (an
// hour, or none), the backend went on working, and calling its own
// backends with that deadline, for a call the proxy had already answered
// DEADLINE_EXCEEDED; told, a gRPC server stops at it and passes the
// deadline on (grpc-go's context). Envoy does so when its route sets
// max_grpc_timeout, which Istio sets to the route's timeout.

// grpcBounded returns rt for the tries of x, telling a gRPC backend the
// deadline each try's context carries (grpcBound) when x is a gRPC call
// under a rule's timeouts; rt as it is otherwise.
func grpcBounded(x *exchange, rt http.RoundTripper) http.RoundTripper {
	if x.grpc == nil || x.r == nil || x.r.pol.request <= 0 && x.r.pol.backend <= 0 {
		return rt
	}
	return grpcBound{rt}
}

// grpcBound is a RoundTripper whose requests, gRPC calls, go with a
// grpc-timeout no later than their context's deadline.
type grpcBound struct{ rt http.RoundTripper }

func (g grpcBound) RoundTrip(req *http.Request) (*http.Response, error) {
	dl, ok := req.Context().Deadline()
	if !ok {
		return g.rt.RoundTrip(req)
	}
	left := time.Until(dl)
	if app, ok := parseGRPCTimeout(req.Header.Get("Grpc-Timeout")); ok && app <= left {
		return g.rt.RoundTrip(req)
	}
	// The header map is the app's request's, which each try reads anew.
	out := req.WithContext(req.Context())
	out.Header = req.Header.Clone()
	out.Header["Grpc-Timeout"] = []string{encodeGRPCTimeout(left)}
	return g.rt.RoundTrip(out)
}

// encodeGRPCTimeout writes d as a grpc-timeout value: at most eight
// digits and the finest unit they hold (PROTOCOL-HTTP2.md), rounded up,
// so that the backend never gives up before the proxy does (it would
// answer a call the proxy still waits on with its own status), as grpc-go
// rounds its clients' deadlines.
func encodeGRPCTimeout(d time.Duration) string {
	if d <= 0 {
		return "0n"
	}
	for _, u := range grpcTimeoutUnits {
		if n := ceilDiv(d, u.d); n < 1e8 {
			return strconv.FormatInt(int64(n), 10) + string(u.unit)
		}
	}
	return strconv.FormatInt(int64(ceilDiv(d, time.Hour)), 10) + "H" // eight digits hold any Duration
}

var grpcTimeoutUnits = [...]struct {
	d    time.Duration
	unit byte
}{{time.Nanosecond, 'n'}, {time.Microsecond, 'u'}, {time.Millisecond, 'm'}, {time.Second, 'S'}, {time.Minute, 'M'}}

// ceilDiv is d/u rounded up, for d > 0.
func ceilDiv(d, u time.Duration) time.Duration { return (d-1)/u + 1 }
