package httpproxy

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/sockio"
)

// An app that leaves while its request is answered (it timed out, or
// crashed) must not hold the fast path's goroutine and its upstream
// connection until a backend that does not answer does: each such request
// would keep one of the endpoint's MaxConnsPerEndpoint connections, and
// apps that retry would use them all up, after which every request to the
// endpoint waits. net/http's server notices with a read running in the
// background during every request; the fast path starts one only when an
// exchange outlasts watchAfter, so quick answers pay a timer's reset and
// stop, not a goroutine. The same holds for a request waiting for one of
// those connections to come free (h1Conn.conn), for the drain of an
// answer a rule retries (discardAnswer) and for a retry's backoff. As
// nginx, an app's end of stream counts as leaving: an HTTP/1.x client
// that half-closes gets no answer.
//
// Whether an exchange the app left counts canceled or with its answer's
// status is decided once, where the answer begins (answer; a 101's in
// respond): an app the watch saw leave before then gets nothing and
// counts canceled, also when the answer had come meanwhile (the watch
// closed the upstream connection after its head was read); one that
// leaves after counts with the status, and the watch cuts the answer
// short.

// watchAfter is how long an exchange runs before the app's connection is
// watched.
const watchAfter = time.Second

// errClientGone ends an exchange whose app left.
var errClientGone = errors.New("client closed its connection before the answer")

// clientWatch watches an h1Conn's client while its exchange waits on the
// backend. One per connection, reused.
type clientWatch struct {
	s  *h1Conn
	t  *time.Timer
	mu sync.Mutex
	// on is set while an exchange is watched; uc or cancel is what ends
	// its wait on the backend.
	on     bool
	uc     *pool.Conn
	cancel context.CancelFunc
	// held says the client's next bytes are the watched request's body,
	// held unread for the backend (while an ExternalAuth server that gets
	// no body is asked): the watch must not stop at them, as at a
	// pipelined request, and waits for the client's hangup instead.
	held bool
	// done is non-nil while a read of the client runs, closed when it
	// returns.
	done chan struct{}
	// gone is set when the client left and the exchange was ended.
	gone atomic.Bool
}

// start watches the client from watchAfter on, until stop, ending the
// exchange by closing uc or calling cancel when it leaves. The caller
// must not read the client until stop. On a watch already started (while
// the request waited for uc), it says what now ends the exchange, and
// ends it at once if the client has left.
func (w *clientWatch) start(uc *pool.Conn, cancel context.CancelFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.on {
		w.uc, w.cancel = uc, cancel
		if uc != nil && w.gone.Load() {
			uc.Conn.Close()
		}
		return
	}
	w.gone.Store(false)
	w.on, w.uc, w.cancel = true, uc, cancel
	if w.t == nil {
		w.t = time.AfterFunc(watchAfter, w.fire) // fire reads w.t under mu
	} else {
		w.t.Reset(watchAfter)
	}
}

// fire reads the client (it runs in a goroutine of its own) until data,
// an error or stop comes: an error other than stop's deadline means the
// client left. While a request body is still read from the client (by
// the body's goroutine) it tries again later, unless the body broke off
// or is malformed and no answer came: the backend waits for the rest of
// the body and will not answer, so the exchange ends (forward answers
// 400). An answer that had started by then was the backend's early one,
// and goes on. A panic anywhere in it reads as the client gone (left):
// the exchange ends, and stop's wait for the read (done) too.
func (w *clientWatch) fire() {
	var done chan struct{}
	var err error
	// Deferred in this order, so that a panic ends the exchange before
	// done lets stop return: after, left would end the next one.
	defer func() {
		if done != nil {
			close(done)
		}
	}()
	defer w.s.h.cfg.Panics.Recover("client watch", &err, w.left)
	done, held := w.begin()
	if done == nil {
		return
	}
	if err = w.wait(held); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		return // a pipelined request, or stop
	}
	w.left()
}

// begin readies fire's read of the client, under mu; done is nil when
// there is none to make: the exchange is over, a read runs, or the body's
// goroutine still reads the client (begin then ends a stranded exchange,
// or one whose client left while that goroutine waits on the backend:
// appLeftBody, or looks again later). Every section under mu unlocks in
// a defer, so that a panic (fire's recover) leaves it unlocked.
func (w *clientWatch) begin() (done chan struct{}, held bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.on || w.done != nil {
		return nil, false
	}
	s := w.s
	s.t.keepAlive(s.c)
	if s.sent.unread() {
		switch {
		case s.sent.stranded():
			w.end()
		case w.appLeftBody():
			w.gone.Store(true)
			w.end()
		default:
			w.t.Reset(watchAfter)
		}
		return nil, false
	}
	s.c.SetReadDeadline(time.Time{}) // an idle deadline may be armed; stop restores it
	w.done = make(chan struct{})     // last: stop waits for it, which only fire closes
	return w.done, w.held
}

// appLeftBody reports whether the client left while its request body's
// goroutine waits on the backend: a backend that stops taking the body
// holds that goroutine in its write upstream, reading nothing more from
// the client, for as long as the backend stays (no stall: the stall watch
// watches the client, who is not waited on), and the watch may not read
// the client meanwhile (the goroutine reads it next). So it looks without
// reading: once the goroutine read nothing for a whole watchAfter, a
// stream the client ended (FIN, or a reset: a vanished client's, once the
// keep-alive begin turned on gives up) means the client left, as the
// watch's own read would find. A client that half-closed in the middle of
// its body then gets no answer, where the goroutine, had the backend let
// it read on, would have found the body broken (400).
func (w *clientWatch) appLeftBody() bool {
	return w.s.sent.stuck() && streamEnded(w.s.c)
}

// streamEnded reports, without reading or waiting, whether the peer of
// the TCP connection under c ended its stream or reset it: the kernel's
// state of it (sockio.AwaitHangup waits, and takes the read side).
func streamEnded(c net.Conn) bool {
	tc := sockio.TCP(c)
	if tc == nil {
		return false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	var state uint8
	rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			state = info.State
		}
	})
	// The kernel's TCP states (include/net/tcp_states.h), which x/sys
	// names for BPF: CLOSE_WAIT after the peer's FIN, CLOSE after a
	// reset or a keep-alive that gave up.
	return state == unix.BPF_TCP_CLOSE_WAIT || state == unix.BPF_TCP_CLOSE
}

// left ends the watched exchange, its client gone. Under mu: detach may
// be about to give uc back to the pool.
func (w *clientWatch) left() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.on {
		return
	}
	w.gone.Store(true)
	w.end()
}

// wait returns when the client sends a byte (nil) or leaves (an error),
// or at stop's deadline. When held, a byte is the request's body, which
// the backend is still to get: it waits, reading no further, for the
// client's hangup. An app that sent its whole body and left was noticed
// only when the wait gave up otherwise (ExternalAuthTimeout).
func (w *clientWatch) wait(held bool) error {
	_, err := w.s.br.Peek(1)
	if err != nil || !held {
		return err
	}
	switch err := sockio.AwaitHangup(w.s.c); {
	case err == nil:
		return errClientGone
	case errors.Is(err, os.ErrDeadlineExceeded):
		return err
	default:
		return nil // no socket to wait on: as at a pipelined request
	}
}

// hold says the request about to be watched has its body held unread
// (held), until stop.
func (w *clientWatch) hold() {
	w.mu.Lock()
	w.held = true
	w.mu.Unlock()
}

// end ends the watched exchange's wait on the backend; under mu.
func (w *clientWatch) end() {
	if w.uc != nil {
		w.uc.Conn.Close()
	}
	if w.cancel != nil {
		w.cancel()
	}
}

// detach forgets the exchange's upstream connection before it goes back
// to the pool, where closing it would hurt another exchange.
func (w *clientWatch) detach() {
	w.mu.Lock()
	w.uc = nil
	w.mu.Unlock()
}

// stop ends the watch; once it returns, nothing reads the client but the
// caller, and its read deadline is s.deadline again.
func (w *clientWatch) stop() {
	if w.t == nil {
		return
	}
	w.mu.Lock()
	w.on, w.uc, w.cancel, w.held = false, nil, nil, false
	done := w.done
	w.done = nil
	if done != nil {
		w.s.c.SetReadDeadline(aLongTimeAgo) // ends the read
	}
	w.mu.Unlock()
	w.t.Stop()
	if done != nil {
		<-done
		w.s.c.SetReadDeadline(w.s.deadline)
	}
}
