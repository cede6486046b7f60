package httpproxy

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/net/http2"

	"github.com/sockmesh/sockmesh/userspace-proxy/routes"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// gRPC status codes (google.golang.org/grpc/codes) for calls the backend
// ends abnormally; routes has those of route decisions.
const (
	grpcCanceled          = 1
	grpcUnknown           = 2
	grpcDeadlineExceeded  = 4
	grpcPermissionDenied  = 7
	grpcResourceExhausted = 8
	grpcInternal          = 13
)

// grpcCall is a gRPC request over HTTP/2 on the net/http path, whose
// abnormal end the proxy reports as a gRPC status.
type grpcCall struct {
	// deadline is when the call's grpc-timeout runs out, counted from its
	// arrival here; zero without one.
	deadline time.Time
}

// grpcCallOf returns the call r is, or nil when r is not gRPC over HTTP/2.
func grpcCallOf(r *http.Request) *grpcCall {
	if r.ProtoMajor != 2 || !isGRPC(r) {
		return nil
	}
	g := &grpcCall{}
	if d, ok := parseGRPCTimeout(r.Header.Get("Grpc-Timeout")); ok {
		g.deadline = time.Now().Add(d)
	}
	return g
}

// parseGRPCTimeout reads a grpc-timeout value: up to eight digits and a
// unit (PROTOCOL-HTTP2.md).
func parseGRPCTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	if n > math.MaxInt64/int64(unit) {
		return 0, false // beyond any deadline a clock can hold
	}
	return time.Duration(n) * unit, true
}

// resetStatus is the status for a call whose stream the backend reset
// (err carries an HTTP/2 stream error; ok false otherwise), as grpc-go's
// client reads a reset (resetCodes), which is what a client connected to
// the backend would get. The proxy must say it itself, in a status:
// net/http's server resets streams with INTERNAL_ERROR only, which gRPC
// clients read as INTERNAL — a backend's CANCEL at the call's deadline
// would reach the app as INTERNAL instead of DEADLINE_EXCEEDED. g may be
// nil (not a gRPC call).
func (g *grpcCall) resetStatus(err error) (code int, reason string, ok bool) {
	var se http2.StreamError
	if g == nil || !errors.As(err, &se) {
		return 0, "", false
	}
	code, known := resetCodes[se.Code]
	if !known {
		code = grpcUnknown
	}
	if code == grpcCanceled && !g.deadline.IsZero() && !time.Now().Before(g.deadline) {
		// grpc-go too: a CANCEL once the deadline has passed was most
		// likely the backend giving up at it.
		return grpcDeadlineExceeded, "deadline exceeded at the backend", true
	}
	return code, "backend reset the stream: " + se.Code.String(), true
}

// resetCodes maps an RST_STREAM error code to the gRPC status grpc-go's
// client gives the call (internal/transport http2ErrConvTab, v1.85), so
// that a grpc-go app gets through the L7 path what it gets through the
// L4 path, where the reset itself reaches it. grpc-go departs from
// PROTOCOL-HTTP2.md in one code: FLOW_CONTROL_ERROR is RESOURCE_EXHAUSTED
// there, not INTERNAL. A code not listed is UNKNOWN, as in grpc-go.
var resetCodes = map[http2.ErrCode]int{
	http2.ErrCodeNo:                 grpcInternal,
	http2.ErrCodeProtocol:           grpcInternal,
	http2.ErrCodeInternal:           grpcInternal,
	http2.ErrCodeFlowControl:        grpcResourceExhausted,
	http2.ErrCodeSettingsTimeout:    grpcInternal,
	http2.ErrCodeStreamClosed:       grpcInternal,
	http2.ErrCodeFrameSize:          grpcInternal,
	http2.ErrCodeRefusedStream:      routes.GRPCUnavailable,
	http2.ErrCodeCancel:             grpcCanceled,
	http2.ErrCodeCompression:        grpcInternal,
	http2.ErrCodeConnect:            grpcInternal,
	http2.ErrCodeEnhanceYourCalm:    grpcResourceExhausted,
	http2.ErrCodeInadequateSecurity: grpcPermissionDenied,
	http2.ErrCodeHTTP11Required:     grpcInternal,
}

// failStatus is the status for a call that failed with err, of class
// reason: the backend's reset maps as resetStatus says; a route's timeout
// is DEADLINE_EXCEEDED (a deadline the proxy enforced has passed, and
// clients retry UNAVAILABLE: Envoy answers so since envoyproxy/envoy#44479);
// anything else is UNAVAILABLE, what gRPC makes of the 502 or 503 an HTTP
// client would get. The message is the reason.
func (g *grpcCall) failStatus(err error, reason upstream.Reason) (code int, why string) {
	if code, why, ok := g.resetStatus(err); ok {
		return code, why
	}
	if reason == upstream.ReasonTimeout {
		return grpcDeadlineExceeded, string(reason)
	}
	return routes.GRPCUnavailable, string(reason)
}

// setGRPCTrailers ends a gRPC answer whose headers are sent with a status.
func setGRPCTrailers(h http.Header, code int, reason string) {
	h[http.TrailerPrefix+"Grpc-Status"] = []string{strconv.Itoa(code)}
	h[http.TrailerPrefix+"Grpc-Message"] = []string{"sockmesh: " + reason}
}
