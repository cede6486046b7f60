package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"

	"golang.org/x/net/http2"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/userspace-proxy/h2connect"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstreamtls"
)

// Reason is why a connection or request could not be served; it is the
// metric label and log value. The set is closed.
type Reason string

const (
	ReasonInvalidPolicy Reason = "invalid_policy"
	ReasonNoEndpoints   Reason = "no_endpoints"
	ReasonRefused       Reason = "refused"
	ReasonDialFailed    Reason = "dial_failed"
	ReasonTLSVerify     Reason = "tls_verify"
	ReasonTLSHandshake  Reason = "tls_handshake"
	ReasonProtocol      Reason = "protocol"
	ReasonCanceled      Reason = "canceled"
	ReasonUpstream      Reason = "upstream_error"
	// ReasonTimeout: a route rule's request or backendRequest timeout
	// (GEP-1742) passed before the backend answered (ErrTimeout).
	ReasonTimeout Reason = "timeout"
	// ReasonRetryBudget: a route rule would retry the request, but the
	// backend's retry budget (XBackendTrafficPolicy) is spent
	// (ErrRetryBudgetExhausted).
	ReasonRetryBudget Reason = "retry_budget_exhausted"
	// ReasonRefusedStream: an HTTP/2 backend refused the request's stream
	// and it could not go again (ErrRefusedStream).
	ReasonRefusedStream Reason = "refused_stream"
	// ReasonPoolBusy: every HTTP/1.1 connection the endpoint may have
	// stayed in use while the request waited, or the HTTP/2 connection it
	// was given had no stream free (pool.ErrBusy; Config.ConnWait).
	ReasonPoolBusy Reason = "pool_busy"
	// ReasonAppStalled: the app left a read of its request body or a
	// write of its answer under way with no byte through for the proxy's
	// stall timeout; the exchange was ended (httpproxy's stallWatch).
	ReasonAppStalled Reason = "app_stalled"
)

// Status is the HTTP status an L7 client gets for r: 503 when the backend is
// unavailable (invalid policy, no endpoints, refused or unreachable, retry
// budget spent: the Gateway API asks for 503 there; a stream it refused,
// as Envoy answers one; every connection to it busy, as Envoy answers a
// request past its pending queue), 504
// when a route's timeout passed, 502 when it answered badly (certificate
// verification, handshake, protocol).
func (r Reason) Status() int {
	switch r {
	case ReasonInvalidPolicy, ReasonNoEndpoints, ReasonRefused, ReasonDialFailed, ReasonRetryBudget, ReasonRefusedStream, ReasonPoolBusy:
		return http.StatusServiceUnavailable
	case ReasonTimeout:
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

// FailClosedError says a backend's properties cannot be honoured: the proxy
// answers 503 or resets, never sends cleartext.
type FailClosedError struct {
	Policy  snapshot.ObjectRef
	Reason  string
	Message string
}

func (e *FailClosedError) Error() string {
	return fmt.Sprintf("backend fails closed: policy %s: %s: %s", e.Policy, e.Reason, e.Message)
}

// ErrNoEndpoints: the backend has no ready endpoint.
var ErrNoEndpoints = errors.New("no ready endpoints")

// ErrTimeout marks a request that a route rule's request or backendRequest
// timeout ended (ReasonTimeout).
var ErrTimeout = errors.New("route timeout passed")

// ErrRetryBudgetExhausted marks a request whose retry its backend's retry
// budget refused (ReasonRetryBudget).
var ErrRetryBudgetExhausted = errors.New("retry budget exhausted")

// dialError marks errors from opening the connection — the TCP connect,
// or a TLS handshake that never came or that the endpoint broke off —
// before any byte of the app's reached the backend (safe to retry
// elsewhere).
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// Classify maps an error from this package, a handshake or a round trip to
// its Reason.
func Classify(err error) Reason {
	var fc *FailClosedError
	var de *dialError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrTimeout):
		return ReasonTimeout
	case errors.Is(err, ErrRetryBudgetExhausted):
		return ReasonRetryBudget
	case errors.Is(err, ErrRefusedStream):
		return ReasonRefusedStream
	case errors.Is(err, pool.ErrBusy):
		return ReasonPoolBusy
	case errors.As(err, &fc):
		return ReasonInvalidPolicy
	case errors.Is(err, ErrNoEndpoints):
		return ReasonNoEndpoints
	case upstreamtls.IsVerifyError(err):
		return ReasonTLSVerify
	case errors.Is(err, context.Canceled):
		// Before the connect's reasons: a connect or handshake the
		// caller's context ended failed nothing of the backend's.
		return ReasonCanceled
	case errors.Is(err, syscall.ECONNREFUSED):
		return ReasonRefused
	case errors.Is(err, errHandshake), isRemoteAlert(err):
		return ReasonTLSHandshake
	case errors.As(err, &de):
		return ReasonDialFailed
	case errors.Is(err, ErrNotHTTP11), errors.Is(err, ErrNotHTTP2), errors.Is(err, ErrNoExtendedConnect), errors.Is(err, h2connect.ErrProtocol),
		errors.Is(err, pool.ErrHeadTooLarge),
		errors.Is(streamCause(err), pool.ErrHeadTooLarge):
		return ReasonProtocol
	}
	return ReasonUpstream
}

// streamCause is the cause of err's HTTP/2 stream error, if it has one:
// net/http's HTTP/2 Transport wraps what failed a stream on the proxy's
// side (a 1xx answer past its bound) in one that does not unwrap to it.
func streamCause(err error) error {
	var se http2.StreamError
	if !errors.As(err, &se) {
		return nil
	}
	return se.Cause
}

// ErrNotSent marks an error of a request's RoundTrip through
// RoundTripper when nothing of the request went toward its endpoint: it
// waited for one of the endpoint's HTTP/1.1 connections
// (pool.ErrNotHandedOut), for a connection another request's dial made,
// or for a stream on an HTTP/2 connection it was given, until its context
// ended or the wait's bound passed (pool.ErrBusy), and no connect was
// tried for it nor a head of it written. A retry whose try fails so was
// never sent. The error reads as its cause.
var ErrNotSent = errors.New("request not sent")

// notSent is an error that Is ErrNotSent.
type notSent struct{ err error }

func (e notSent) Error() string        { return e.err.Error() }
func (e notSent) Unwrap() error        { return e.err }
func (e notSent) Is(target error) bool { return target == ErrNotSent }

// NoConnection reports whether err is a connect that failed (refused, no
// answer, a TLS handshake the endpoint broke off): nothing went to the
// endpoint, so another may be tried.
func NoConnection(err error) bool {
	var de *dialError
	return errors.As(err, &de)
}

var errHandshake = errors.New("upstream tls handshake")

// isRemoteAlert reports a TLS alert from the backend, which crypto/tls
// returns as a net.OpError with Op "remote error". In TLS 1.3 the server
// checks a client certificate after the client considers the handshake
// done, so a missing or rejected client certificate surfaces this way on the
// first read.
func isRemoteAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}
