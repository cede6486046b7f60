package httpproxy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/balance"
	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/routes"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// A route rule's timeouts (GEP-1742) and retries (GEP-1731), as the L7
// paths execute them:
//
//   - timeouts.request bounds the whole exchange from the routing decision
//     until the response is complete, an ExternalAuth filter's ask
//     (authorize), the read of a body the proxy keeps (readBody), retries
//     and backoff included, and once it passed nothing goes to a backend;
//     when it passes before the answer starts the client gets 504, after
//     that its connection or stream is cut (the answer cannot be taken
//     back).
//   - timeouts.backendRequest bounds each attempt, from the first byte
//     sent to the last byte of the response; when it passes before the
//     answer starts, the request is retried if the retry policy allows it,
//     else 504.
//   - A request is retried (attempts = retries after the first try, each
//     on an endpoint it has not tried while there is one, unless its
//     session pins one: repick) when no connection could be made
//     (refused, unreachable, TLS handshake failure), when backendRequest
//     passed, and when the backend answered one of retry.codes or a
//     trailers-only gRPC UNAVAILABLE (grpcTurnedAway), whose body it does
//     not wait for (drain). Never after an answer started toward the
//     client, and, unless the body was kept or, of unknown length (a gRPC
//     call's), recorded within RoutingConfig.ReplayBytes (keepBody,
//     teeBody), never once a byte of the body was sent.
//   - A stream an HTTP/2 backend refuses (REFUSED_STREAM, or past its
//     GOAWAY) was not processed, and net/http's Transport sends it again
//     on its own, routed or not — the proxy's burst on a new connection
//     outruns the backend's stream limit. One with a body asks GetBody
//     (roundTrip), which gives it again while it is kept or recorded
//     (toward HTTP/2 every streamed body is, up to ReplayBytes; resend):
//     none of the rule's retries nor of the budget. upstream sends each
//     again at once, with a body or not, counted as refused_stream, and
//     past upstream.MaxResends the app gets 503 refused_stream; the
//     request timeout may end it sooner.
//   - A backend with a retry budget (XBackendTrafficPolicy retryConstraint,
//     package retrybudget) counts every request sent to it (countRequest)
//     and every retry, taken before its backoff; a retry the budget
//     refuses is not sent, and the client gets 503
//     (ErrRetryBudgetExhausted), as the API requires (spendRetry); one
//     never sent, its app gone or its request timed out in the backoff,
//     or its try given no connection (toward HTTP/2, no stream), is given
//     back (giveBack, settleRetry), and a retry is counted sent once its
//     try got, or tried to make, a connection, toward HTTP/2 once its
//     HEADERS were written (settleRetry).

// policy is a routed request's retries and timeouts, resolved against the
// RoutingConfig defaults. The zero value does nothing.
type policy struct {
	active  bool
	retries int
	codes   []int
	backoff time.Duration
	// request and backend are the timeouts; 0: none.
	request, backend time.Duration
	// deadline is when request passes (zero: never); set by start.
	deadline time.Time
	// pause is the wait before retry planned (0: none), drawn by plan;
	// late says the request deadline comes first.
	pause   time.Duration
	planned int
	late    bool
}

// policyFor resolves a Forward decision's policy.
func (h *Handler) policyFor(d *routes.Decision) policy {
	cfg := &h.cfg.Routing
	p := policy{request: cfg.RequestTimeout, backend: cfg.BackendRequestTimeout, backoff: cfg.RetryBackoff}
	if t := d.Timeouts; t != nil {
		if t.Request != nil {
			p.request = max(time.Duration(*t.Request), 0) // "0s" disables
		}
		if t.BackendRequest != nil {
			p.backend = max(time.Duration(*t.BackendRequest), 0)
		}
	}
	if r := d.Retry; r != nil {
		p.retries, p.codes = max(r.Attempts, 0), r.Codes
		if r.Backoff != nil {
			p.backoff = max(time.Duration(*r.Backoff), 0)
		}
	}
	p.active = p.retries > 0 || p.request > 0 || p.backend > 0
	if p.request > 0 {
		p.deadline = time.Now().Add(p.request)
	}
	return p
}

// expired reports whether the request timeout has passed at now.
func (p *policy) expired(now time.Time) bool {
	return !p.deadline.IsZero() && !now.Before(p.deadline)
}

// retryStatus reports whether an answer with code is retried.
func (p *policy) retryStatus(code int) bool { return slices.Contains(p.codes, code) }

// delay is how long to wait before retry n (1 for the first): a random
// time between half and all of backoff·2ⁿ⁻¹, capped at max(10·backoff,
// 1 s).
func (p *policy) delay(n int) time.Duration {
	if p.backoff <= 0 {
		return 0
	}
	ceiling := max(10*p.backoff, time.Second)
	d := ceiling
	if n-1 < 63 && p.backoff <= ceiling>>(n-1) { // backoff·2ⁿ⁻¹ ≤ ceiling, without overflow
		d = p.backoff << (n - 1)
	}
	return d/2 + rand.N(d/2+1)
}

// limit is the time attempt may take from now: backendRequest, or what is
// left of request when that is shorter (request then says so). ok is false
// when neither applies.
func (p *policy) limit(now time.Time) (d time.Duration, request, ok bool) {
	left := time.Duration(-1)
	if !p.deadline.IsZero() {
		left = max(p.deadline.Sub(now), 0)
	}
	switch {
	case p.backend > 0 && (left < 0 || p.backend < left):
		return p.backend, false, true
	case left >= 0:
		return left, true, true
	}
	return 0, false, false
}

// plan draws the wait before retry n and reports whether the request
// deadline allows the retry after it; wait then takes it.
func (p *policy) plan(n int) bool {
	p.pause, p.planned, p.late = p.delay(n), n, false
	if !p.deadline.IsZero() {
		if left := time.Until(p.deadline); left <= p.pause {
			p.pause, p.late = left, true
		}
	}
	return !p.late
}

// wait sleeps before retry n and reports whether the request deadline
// allows the retry; when it does not, wait returns at the deadline.
func (p *policy) wait(ctx context.Context, n int) bool {
	if p.planned != n {
		p.plan(n)
	}
	if p.pause > 0 {
		t := time.NewTimer(p.pause)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
	return !p.late
}

// errRequestTimeout and errBackendTimeout are what a request ended by a
// route's request or backendRequest timeout fails with (wrapped by
// timeoutError); both are upstream.ErrTimeout.
var (
	errRequestTimeout = fmt.Errorf("request %w", upstream.ErrTimeout)
	errBackendTimeout = fmt.Errorf("backendRequest %w", upstream.ErrTimeout)
)

func timeoutError(request bool, err error) error {
	if request {
		return fmt.Errorf("%w: %w", errRequestTimeout, err)
	}
	return fmt.Errorf("%w: %w", errBackendTimeout, err)
}

// timedOut is err, the failure of an answer's body, as the route timeout
// that ended it, if one did: the only deadlines a body's read runs under
// are the route's request and backendRequest timeouts.
func (x *exchange) timedOut(err error) error {
	if x.r == nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return timeoutError(x.r.pol.expired(time.Now()), err)
}

// grpcTurnedAway reports a trailers-only gRPC answer with status
// UNAVAILABLE: the stream ended with the headers that carry it, no message
// came. HTTPRouteRetry names it among the answers of a backend that
// "explicitly rejected the request before processing it", which a rule
// with a retry stanza SHOULD retry; an UNAVAILABLE in trailers after a
// message has reached the app's side and is not.
func grpcTurnedAway(resp *http.Response) bool {
	return resp.Body == http.NoBody && isGRPCType(resp.Header) && resp.Header.Get("Grpc-Status") == grpcUnavailable
}

var grpcUnavailable = strconv.Itoa(routes.GRPCUnavailable)

// connectFailed reports an error from making the connection (no byte of
// the request reached the backend): a retry is safe.
func connectFailed(err error) bool {
	switch upstream.Classify(err) {
	case upstream.ReasonRefused, upstream.ReasonDialFailed, upstream.ReasonTLSHandshake:
		return true
	}
	return false
}

// readBody runs read on body, x's request body, read for the proxy itself
// (authBody, keepBody), under the rule's request deadline (GEP-1742: the
// whole exchange) as a deadline on reads from the app (x.app); reads after
// it have none, as while a body is forwarded. A read the deadline ends
// fails with the request timeout's error. Tell it from the app leaving by
// that error, not the request's context: net/http's HTTP/1 server cancels
// that context as the deadline fails the read. The reads are under the
// stall watch, whatever the backend's wire: the body is read whole before
// the request goes, so an app that stops in it is no quiet stream (as a
// gRPC client's toward an HTTP/2 backend may be), and would hold the
// exchange (its goroutine, the body read so far, an HTTP/2 app's stream)
// for as long as it stays.
func (x *exchange) readBody(body io.ReadCloser, read func(io.Reader) error) error {
	p := &x.r.pol
	if !p.deadline.IsZero() {
		x.app.SetReadDeadline(p.deadline)
		defer x.app.SetReadDeadline(time.Time{})
	}
	x.stalls.watch()
	err := read(&stalledReader{ReadCloser: body, w: x.stalls})
	switch {
	case err != nil && p.expired(time.Now()):
		return timeoutError(true, fmt.Errorf("read request body: %w", err))
	case err != nil:
		return fmt.Errorf("read request body: %w", err)
	}
	return nil
}

// keepBody readies a request body the policy or mirrors may send more
// than once: one of known length within ReplayBytes that expects no 100
// Continue is read (readBody) and kept, and replaces r's body; one of
// unknown length is recorded as it streams, up to ReplayBytes (x.record).
// A read that fails is the request timeout's, or the app left or broke
// its body off (readFailed).
func (h *Handler) keepBody(x *exchange, r *http.Request, expects bool) error {
	rt := x.r
	if r.Body == nil || r.Body == http.NoBody || rt.pol.retries == 0 && len(rt.d.Mirrors) == 0 {
		return nil
	}
	if r.ContentLength < 0 {
		x.record(r, h.cfg.Routing.ReplayBytes)
		return nil
	}
	if expects || r.ContentLength == 0 || r.ContentLength > int64(h.cfg.Routing.ReplayBytes) {
		return nil
	}
	buf := make([]byte, r.ContentLength)
	if err := x.readBody(r.Body, func(body io.Reader) error {
		_, err := io.ReadFull(body, buf)
		return err
	}); err != nil {
		return err
	}
	rt.body, rt.kept = buf, true
	r.Body = replayBody(buf)
	return nil
}

// readFailed is the reason of a request whose body the proxy could not
// read itself (readBody): the rule's request timeout (504), the stall
// watch's (the app reset), else the app left (canceled), or broke the
// body off or sent it malformed, which both L7 paths answer 400
// (bodyReadFailed tells which).
func readFailed(err error) upstream.Reason {
	switch {
	case errors.Is(err, errRequestTimeout):
		return upstream.ReasonTimeout
	case errors.Is(err, errAppStalled):
		return upstream.ReasonAppStalled
	}
	return upstream.ReasonCanceled
}

// bodyReadFailed says how r fails, whose body the proxy read itself
// (readBody) and could not, err: refuse when the app broke the body off
// or sent it malformed and is there to read the 400 (refuseBody), else
// with reason (readFailed: the rule's request timeout, a stall, or
// canceled when the app left, appLeft). Both L7 paths' bodyFailed ask it.
func bodyReadFailed(r *http.Request, err error) (reason upstream.Reason, refuse bool) {
	reason = readFailed(err)
	return reason, reason == upstream.ReasonCanceled && !appLeft(r, err)
}

// appLeft reports whether r's app left, where reading its body failed
// with err. On HTTP/2 its context says so: the app reset its stream, or
// its connection ended; a body that broke with the stream open (shorter
// than its Content-Length) leaves it be. On HTTP/1 (the fast path, and
// net/http's server, which cancels the context at the app's end of
// stream too) the app left if its connection failed (*net.OpError: a
// reset, or closed by the server); a half-close in the middle of a body
// only breaks the body off (400), and a malformed chunk is the parser's
// error. The deadlines a body's read runs under fail as the request
// timeout or a stall (readFailed), or are the proxy's own ending of the
// read (the fast path's finish and halt), never a broken body.
func appLeft(r *http.Request, err error) bool {
	if r.ProtoMajor != 1 {
		return r.Context().Err() != nil
	}
	var conn *net.OpError
	return errors.As(err, &conn)
}

// resend is the body of x's request again for a stream net/http's HTTP/2
// Transport sends again on its own (its GetBody): one the backend refused
// (REFUSED_STREAM, or past its GOAWAY), which it never processed (RFC
// 9113 §8.7, §6.8), so sending it again is safe whatever the method, and
// is none of a rule's retries nor taken from the retry budget: the
// proxy's own burst on a new connection outruns the backend's
// SETTINGS_MAX_CONCURRENT_STREAMS, which the Transport does not wait for.
// upstream sends them at once, bounded and counted (MaxResends), with a
// body or not, and asks once for each. It fails when the body is not at
// hand whole: not kept, and outgrown its recording (x.tee, up to
// ReplayBytes).
func (h *Handler) resend(x *exchange) (io.ReadCloser, error) {
	switch {
	case x.r != nil && x.r.kept:
		return replayBody(x.r.body), nil
	case x.tee.handOver():
		return x.tee.again(), nil
	}
	return nil, errNotRecorded
}

// errNotRecorded is why net/http's Transport cannot send a streamed body
// again: it outgrew its recording (ReplayBytes), or reading it failed.
var errNotRecorded = fmt.Errorf("%w: request body not recorded whole: cannot send it again", upstream.ErrRefusedStream)

func replayBody(b []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }

// replayable reports whether the request's whole body is at hand: it has
// none, or it was kept.
func (x *exchange) replayable(r *http.Request) bool {
	return r.Body == nil || r.Body == http.NoBody || x.r != nil && x.r.kept
}

// resendable reports whether the request may be sent again now: it is
// replayable, or all that its tries read of its streamed body was
// recorded (x.tee; with a limit of 0, none was read: its connects
// failed), which the try under way then hands over (teeBody.handOver).
// Ask only when a retry follows a yes.
func (x *exchange) resendable(r *http.Request) bool {
	return x.replayable(r) || x.tee.handOver()
}

// again is the body for try n (0 for the first) of a request whose body
// is body: a kept one afresh; after the first, a streamed one's next try
// (teeBody.again).
func (x *exchange) again(body io.ReadCloser, n int) io.ReadCloser {
	switch {
	case x.r != nil && x.r.kept:
		return replayBody(x.r.body)
	case n > 0 && x.tee != nil:
		return x.tee.again()
	}
	return body
}

// unpin lets a request whose session named the endpoint its connect failed
// to go to another: nothing reached that endpoint, and the session starts
// afresh on the one that answers, as under Envoy's non-strict stateful
// sessions (GEP-1619: a session whose endpoint is unavailable goes on
// elsewhere). An MCP session pinned without session persistence starts
// none: the backend's 404 has the client start a new one.
func (x *exchange) unpin() {
	if x.pinned {
		x.pinned, x.setSession = false, x.sessionFor() != nil
	}
}

// repick is the endpoint for a retry: the same one when the request's
// session pins it, else a ready one the request has not tried, as Istio
// has Envoy retry by default (retry_host_predicate previous_hosts): an
// endpoint that answered a status the rule retries, or timed out, is
// likely to again (a pod overloaded or shutting down), and the Picker's
// next turn is that endpoint again whenever other requests took the
// turns between (balance.Picker.Untried). A session the request starts
// names the endpoint that answers. A ClientIP pin stays: the endpoint
// answered.
func (x *exchange) repick(c *balance.Choice) *balance.Choice {
	if x.pinned {
		return c
	}
	x.tried.Add(c.Endpoint.Addr)
	return cmp.Or(x.be.Picker.Untried(x.tried, x.be.Picker.Pick), c)
}

// failover is the endpoint for a try after the connect to c failed: as a
// retry's (repick), one the request has not tried while there is one
// (balance.Tried says why ejection does not suffice), also when its
// session named c (unpin). Under ClientIP affinity (no session
// persistence: PickRequest) its client is pinned to that endpoint, as
// the L4 relay's is (balance.Picker.FailoverClient): left pinned to c,
// its next requests went to c, which refused, each first a connect that
// failed, for as long as ejection did not keep c out.
func (x *exchange) failover(c *balance.Choice) *balance.Choice {
	x.unpin()
	x.tried.Add(c.Endpoint.Addr)
	p := x.be.Picker
	if x.sessionFor() != nil {
		return cmp.Or(p.Untried(x.tried, p.Pick), c)
	}
	return cmp.Or(p.FailoverClient(x.t.clientKey(), x.tried), c)
}

// roundTrip sends out (addressed to c) through rt, under x's route policy
// when it has one: timeouts as contexts, retries per the rule. served is
// the endpoint of the last try, which failed connects and retries may have
// moved from c. done must be called once the response body is read (it
// ends the contexts).
func (h *Handler) roundTrip(x *exchange, wire upstream.Wire, out *http.Request, c *balance.Choice) (resp *http.Response, served *balance.Choice, done func(), err error) {
	countRequest(x)
	rt := grpcBounded(x, x.be.RoundTripper(wire))
	if wire == upstream.WireH2 && isWebSocketUpgrade(out) {
		rt = x.be.WebSocketH2() // an RFC 8441 extended CONNECT, answered as a 101
	}
	h2 := x.be.Multiplexed(wire) && out.Body != nil && out.Body != http.NoBody
	if !x.replayable(out) {
		// The transports close the body of a request they fail, and may
		// read it after: each try gets its own (x.again), and the body is
		// closed once the tries are over. Unless a route's retries or
		// mirrors recorded it, or a refused HTTP/2 stream may want it
		// again (resend), a body can go again only when no try read any
		// of it (their connects failed).
		limit := 0
		if h2 {
			limit = h.cfg.Routing.ReplayBytes
		}
		x.record(out, limit)
		defer x.tee.release()
	}
	if h2 {
		out.GetBody = func() (io.ReadCloser, error) { return h.resend(x) }
	}
	if x.r == nil || !x.r.pol.active {
		resp, served, err = h.roundTripAny(x, rt, out, c)
		if err == nil {
			x.tee.settle()
		}
		return resp, served, noop, err
	}
	p := &x.r.pol
	ctx, cancelReq := out.Context(), noop
	if !p.deadline.IsZero() {
		ctx, cancelReq = context.WithDeadline(ctx, p.deadline)
	}
	for n := 0; ; n++ {
		actx, cancel := ctx, noop
		if p.backend > 0 {
			actx, cancel = context.WithTimeout(ctx, p.backend)
		}
		o := out.WithContext(upstream.WithEndpoint(actx, c))
		if n > 0 {
			o.URL = withURLHost(out.URL, c.Host)
		}
		o.Body = x.again(o.Body, n)
		resp, c, err = h.roundTripAny(x, rt, o, c)
		why := ""
		switch {
		case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
			cancel()
			cancelReq()
			return nil, c, noop, timeoutError(true, err)
		case err != nil && errors.Is(actx.Err(), context.DeadlineExceeded):
			err, why = timeoutError(false, err), "backend_timeout"
		case err != nil && connectFailed(err):
			why = "connect"
		case err == nil && p.retryStatus(resp.StatusCode):
			why = "status"
		case err == nil && grpcTurnedAway(resp):
			why = "grpc_unavailable" // an HTTP 200: no status of the rule's codes
		}
		if why == "" || x.retried >= p.retries || !x.resendable(out) {
			if err != nil {
				cancel()
				cancelReq()
				return nil, c, noop, err
			}
			x.tee.settle()
			return resp, c, func() { cancel(); cancelReq() }, nil
		}
		if resp != nil {
			drain(resp)
		}
		cancel()
		taken, err := h.spendRetry(x, why, x.retried, err, resp)
		if err != nil {
			cancelReq()
			return nil, c, noop, err
		}
		if !p.wait(ctx, x.retried+1) {
			giveBack(x, taken)
			cancelReq()
			if err := out.Context().Err(); err != nil {
				return nil, c, noop, err // the client went away
			}
			return nil, c, noop, timeoutError(true, context.DeadlineExceeded)
		}
		x.retry = pendingRetry{why, taken}
		x.retried++
		c = x.repick(c)
	}
}

// roundTripAny sends out through rt to c, the endpoint it names, and, as
// the fast path does (h1Conn.conn), when the connect fails, to other
// endpoints the request has not tried (three in all; failover): nothing
// went out, so a request whose body can go again may go elsewhere, also
// one whose session named c. It returns the endpoint tried last, which
// the session then names. The retry the request's try is, if any, is
// settled by the first send (settleRetry).
func (h *Handler) roundTripAny(x *exchange, rt http.RoundTripper, out *http.Request, c *balance.Choice) (*http.Response, *balance.Choice, error) {
	resp, err := rt.RoundTrip(out)
	// A failover follows a connect tried: the first send tells.
	h.settleRetry(x, !errors.Is(err, upstream.ErrNotSent))
	tries := x.be.Picker.Tries(c)
	for i := 1; err != nil && i < tries && upstream.NoConnection(err) && x.resendable(out); i++ {
		c = x.failover(c)
		o := out.WithContext(upstream.WithEndpoint(out.Context(), c))
		o.URL = withURLHost(out.URL, c.Host)
		o.Body = x.again(o.Body, i)
		resp, err = rt.RoundTrip(o)
	}
	return resp, c, err
}

func noop() {}

// countRequest counts a first try toward x's backend in its retry budget,
// once per request.
func countRequest(x *exchange) {
	if b := x.be.Budget; b != nil && !x.counted {
		x.counted = true
		b.Request(time.Now())
	}
}

// spendRetry takes retry n+1 of a request (why: connect, status,
// grpc_unavailable, backend_timeout) from its backend's retry budget, before its backoff, as
// Envoy takes an active retry from its budget before it arms the backoff
// timer: concurrent requests see the retries that wait. taken is when it
// was taken (zero: nothing was), for giveBack should the retry never be
// sent. When the budget is spent it counts the refusal and returns the
// error the client's 503 is made of, naming what the last try got (err,
// or resp's status). A retry whose wait the request deadline cuts short
// (plan) is never sent, and takes nothing.
func (h *Handler) spendRetry(x *exchange, why string, n int, err error, resp *http.Response) (taken time.Time, _ error) {
	b := x.be.Budget
	if b == nil || !x.r.pol.plan(n+1) {
		return time.Time{}, nil
	}
	if now := time.Now(); b.Retry(now) {
		return now, nil
	}
	h.m.budgetExhausted.WithLabelValues(why).Inc()
	switch {
	case err != nil:
		return time.Time{}, fmt.Errorf("%w for %s after %d retries: %w", upstream.ErrRetryBudgetExhausted, x.be.Spec.Ref, n, err)
	case resp != nil:
		return time.Time{}, fmt.Errorf("%w for %s after %d retries: last answer %d", upstream.ErrRetryBudgetExhausted, x.be.Spec.Ref, n, resp.StatusCode)
	}
	return time.Time{}, fmt.Errorf("%w for %s after %d retries", upstream.ErrRetryBudgetExhausted, x.be.Spec.Ref, n)
}

// pendingRetry is a retry backed off and about to be tried: why it is
// (spendRetry's why), and when the budget took it (zero: nothing did).
type pendingRetry struct {
	why   string
	taken time.Time
}

// settleRetry settles the retry x's try is, if any, once its first send
// (a connection asked of the fast path's pool, a RoundTrip) tells whether
// anything of it went toward the endpoint: it is counted as sent
// (sockmesh_proxy_request_retries_total) when it did — it got or tried
// to make a connection, or, toward HTTP/2, its HEADERS were written —
// and, when nothing did, is given back, as one whose backoff its app
// left: it waited for one of the endpoint's HTTP/1.1 connections, or for
// a stream on an HTTP/2 one, until the app left, a timeout passed or the
// wait's bound did (pool.ErrNotHandedOut, upstream.ErrNotSent). The
// first send alone tells: a failover after it follows a connect tried,
// and a send again after a pooled connection the backend had closed
// follows a request written on it.
func (h *Handler) settleRetry(x *exchange, sent bool) {
	r := x.retry
	if r.why == "" {
		return
	}
	x.retry = pendingRetry{}
	if !sent {
		giveBack(x, r.taken)
		return
	}
	h.m.retries.WithLabelValues(r.why).Inc()
}

// giveBack returns to x's backend's budget a retry spendRetry took at
// taken that is never sent: its app left, or the request timeout passed,
// during the backoff, or its try got no connection (settleRetry). Kept,
// it was a retry nobody sent, and in a retry storm the apps that give up
// soonest spent the budget of the retries that would go.
func giveBack(x *exchange, taken time.Time) {
	if !taken.IsZero() {
		x.be.Budget.GiveBack(taken)
	}
}

// drain gives up an answer that is retried without waiting for its body,
// as Envoy resets it: a backend may send the head of a status the rule
// retries and hold the body back (overloaded, or misbehaving), and the
// retry would wait for it, without end under a rule with no timeout. A
// body come whole over HTTP/1.1 is read, so that its connection serves
// again (BodyAtHand); closing any other costs its HTTP/1.1 connection,
// or an HTTP/2 stream.
func drain(resp *http.Response) {
	if upstream.BodyAtHand(resp) {
		io.Copy(io.Discard, resp.Body)
	}
	resp.Body.Close()
}

// connDeadline ends an attempt on a pooled connection when its time is
// up, by setting the connection's deadlines in the past: the read or
// write in progress fails at once. stop disarms it; a connection whose
// deadline fired is unusable.
type connDeadline struct {
	mu      sync.Mutex
	t       *time.Timer
	uc      *pool.Conn
	fired   bool
	stopped bool
	// request says the limit was the request timeout, which no retry
	// survives.
	request bool
	panics  *contain.Reporter
	// wake is closed when it fires, once expired made it.
	wake chan struct{}
}

// armConn bounds the attempt on uc by x's policy; nil when no timeout
// applies. panics reports a panic in the timer's callback.
func armConn(x *exchange, uc *pool.Conn, panics *contain.Reporter) *connDeadline {
	if x.r == nil || !x.r.pol.active {
		return nil
	}
	d, request, ok := x.r.pol.limit(time.Now())
	if !ok {
		return nil
	}
	cd := &connDeadline{uc: uc, request: request, panics: panics}
	cd.mu.Lock()
	defer cd.mu.Unlock()
	cd.t = time.AfterFunc(d, cd.fire)
	return cd
}

// fire runs in a goroutine of the timer's: a panic in the layers under
// uc (a bug) is contained, and closing uc ends the attempt as the
// deadlines would have.
func (cd *connDeadline) fire() {
	var err error
	defer cd.panics.Recover("route timeout", &err, func() { cd.uc.Conn.Close() })
	cd.mu.Lock()
	defer cd.mu.Unlock()
	if !cd.stopped {
		cd.fired = true
		if cd.wake != nil {
			close(cd.wake)
		}
		cd.uc.SetDeadline(aLongTimeAgo)
	}
}

// expired returns a channel closed once cd fires; nil (never) for a nil
// cd.
func (cd *connDeadline) expired() <-chan struct{} {
	if cd == nil {
		return nil
	}
	cd.mu.Lock()
	defer cd.mu.Unlock()
	if cd.wake == nil {
		cd.wake = make(chan struct{})
		if cd.fired {
			close(cd.wake)
		}
	}
	return cd.wake
}

// stop disarms cd and reports whether it fired. After it returns the timer
// no longer touches the connection. A nil cd never fires.
func (cd *connDeadline) stop() bool {
	if cd == nil {
		return false
	}
	cd.mu.Lock()
	defer cd.mu.Unlock()
	cd.stopped = true
	cd.t.Stop()
	return cd.fired
}

// withURLHost returns a copy of u addressed to host.
func withURLHost(u *url.URL, host string) *url.URL {
	c := *u
	c.Host = host
	return &c
}
