package httpproxy

import (
	"errors"
	"io"
	"net/http"

	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// A routed request's retries on the fast path (policy.go says when the
// rule retries): whether a try may go again (mayRetry), the retry budget
// and the backoff before it (again, backoff), and the end of a try that
// is retried: its request body's goroutine (halt), its answer read or
// its connection closed (discardAnswer). forward (h1exchange.go) drives
// them.

// mayRetry reports whether a routed request may be tried again after
// retry retries: the rule allows more, and the body can be sent again
// (resendable; not once finish stopped the client's) or none was sent
// (why "connect": no connection was made).
func (s *h1Conn) mayRetry(x *exchange, retry int, why string, req *http.Request) bool {
	return x.r != nil && retry < x.r.pol.retries && (why == "connect" || x.replayable(req) || !s.unread && x.resendable(req))
}

// errRetryBackoff is what a request whose timeout passed while it waited
// to be retried failed of.
var errRetryBackoff = errors.New("retry backoff")

// again takes retry n+1 of req (why: connect, status, backend_timeout)
// from its backend's retry budget, then backs off, giving the retry back
// when the backoff ends it (giveBack); past the backoff, the retry is
// settled once its try's connection is known (settleRetry). When the
// request may not go again it answers the client — 503 when the budget is
// spent (last and resp say what the last try got), 504 with timeout, a
// request timeout's error (timeoutError(true, ...)), when the request
// timeout passed during the backoff — and returns keep, whether the
// client's connection stays open.
func (s *h1Conn) again(x *exchange, retry *int, why string, req *http.Request, last error, resp *http.Response, timeout error) (ok, keep bool) {
	taken, err := s.h.spendRetry(x, why, *retry, last, resp)
	if err != nil {
		return false, s.fail(req, x, upstream.ReasonRetryBudget, err)
	}
	if !s.backoff(x, retry, req) {
		giveBack(x, taken)
		if s.watch.gone.Load() {
			return false, s.fail(req, x, upstream.ReasonCanceled, errClientGone)
		}
		return false, s.fail(req, x, upstream.ReasonTimeout, timeout)
	}
	x.retry = pendingRetry{why, taken} // counted once its try's connection is known
	return true, false
}

// backoff waits before a retry, then readies the body; false when the
// request timeout passed meanwhile or the app left (the watch ends the
// wait, as net/http's path ends it with the request's context): that
// retry is never sent, and not counted.
func (s *h1Conn) backoff(x *exchange, retry *int, req *http.Request) bool {
	*retry++
	ctx := s.leaveCtx()
	if !x.replayable(req) {
		// The rest of its body may come next from the app, unread (all
		// of it before a connect retry): the watch waits past it for the
		// app's hangup, as conn's does.
		s.watch.hold()
	}
	s.watch.start(nil, s.leave)
	waited := x.r.pol.wait(ctx, *retry)
	s.watch.stop()
	if !waited {
		return false
	}
	req.Body = x.again(req.Body, *retry)
	return true
}

// halt ends the goroutine sending the body of a try that is retried, if
// any, and reports whether it sent the body whole. A write in progress
// fails at once; a read of the client's body in progress ends as the
// client sends on (the next try would wait for those bytes too), and the
// try reads no more: the next one reads on from there. When the try's
// timeout (cd) passes first, that read is cut (late): the body cannot
// go again.
func (s *h1Conn) halt(body chan error, uc *pool.Conn, cd *connDeadline) (sent, late bool) {
	if body == nil {
		return true, false
	}
	select {
	case err := <-body:
		return err == nil, false
	default:
	}
	uc.SetWriteDeadline(aLongTimeAgo)
	select {
	case <-body:
		return false, false
	case <-cd.expired():
		s.unread = true
		s.setDeadline(aLongTimeAgo, false)
		<-body
		return false, true
	}
}

// discardAnswer drops an answer that is retried without waiting for its
// body (drain says why): one come whole is read so that the connection
// can serve again (upstream.AtHand); any other, or one whose request's
// body was not sent whole, costs the connection.
func (s *h1Conn) discardAnswer(be *upstream.Backend, uc *pool.Conn, resp *http.Response, cd *connDeadline, sent bool) {
	keep := sent && !resp.Close && upstream.AtHand(uc, resp)
	if keep {
		_, err := io.Copy(io.Discard, resp.Body)
		keep = err == nil
	}
	if cd.stop() || !keep {
		be.DiscardH1(uc)
		return
	}
	be.PutH1(uc)
}
