package httpproxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/pool"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// Request bodies on the fast path: held back until 100 Continue, written
// upstream by a goroutine of their own (sentBody, finish), and watched
// while net/http's Transport reads them.

// continueReader holds back a body the client sends only after a 100
// Continue: on the first read it waits until the backend sends its 100
// (release), or ignores the Expect for upstream.ExpectContinueTimeout (as
// the transports do), then passes the 100 on and reads the body. If the
// final answer comes first, the client sends no body (RFC 9110 §10.1.1):
// finish stops the wait and the connection closes after the answer.
type continueReader struct {
	s             *h1Conn
	r             io.ReadCloser
	proceed, stop chan struct{}
	released      sync.Once
	halted        sync.Once
	started       bool
}

func (c *continueReader) release() { c.released.Do(func() { close(c.proceed) }) }

func (c *continueReader) halt() { c.halted.Do(func() { close(c.stop) }) }

func (c *continueReader) Read(p []byte) (int, error) {
	if !c.started {
		c.started = true
		t := time.NewTimer(upstream.ExpectContinueTimeout)
		select {
		case <-c.proceed:
		case <-t.C:
		case <-c.stop:
			t.Stop()
			return 0, errBodyAbandoned
		}
		t.Stop()
		s := c.s
		s.wmu.take()
		var err error
		if !s.answered {
			// Watched: an app that reads none of it would hold the
			// exchange, and its upstream connection, for good.
			_, err = io.WriteString(&s.out, continueLine)
		}
		s.wmu.give()
		if err != nil {
			return 0, fmt.Errorf("write 100 continue: %w", err)
		}
	}
	return c.r.Read(p)
}

func (c *continueReader) Close() error { return c.r.Close() }

const continueLine = "HTTP/1.1 100 Continue\r\n\r\n"

// continueNow sends the 100 Continue that req's client waits for before
// its body, which the proxy reads itself (for an ExternalAuth server), and
// drops the Expect: no backend is asked to decide. An app that reads none
// of it fails it with errAppStalled.
func (s *h1Conn) continueNow(req *http.Request) error {
	if !strings.EqualFold(req.Header.Get("Expect"), "100-continue") || req.Body == http.NoBody || !req.ProtoAtLeast(1, 1) {
		return nil
	}
	delete(req.Header, "Expect")
	s.wmu.take()
	defer s.wmu.give()
	if _, err := io.WriteString(&s.out, continueLine); err != nil {
		return fmt.Errorf("write 100 continue: %w", err)
	}
	return nil
}

// bodyTracker reports on done when net/http's Transport is finished with a
// request body: read to its end (nil), failed, or closed early. A Read in
// progress when the Transport closes it still owns the client's reader, so
// the report waits for that Read to return. The HTTP/2 Transport reads it
// on a goroutine of its own: a panic in the readers beneath fails the
// body (reported to panics), not the process.
type bodyTracker struct {
	r       io.Reader
	panics  *contain.Reporter
	done    chan error
	mu      sync.Mutex
	reading bool
	closed  bool
	over    bool
}

var errBodyAbandoned = errors.New("request body not read to its end")

func (b *bodyTracker) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.over || b.closed {
		b.mu.Unlock()
		return 0, errBodyAbandoned
	}
	b.reading = true
	b.mu.Unlock()
	n, err := b.read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reading = false
	switch {
	case err == io.EOF:
		b.end(nil)
	case err != nil:
		b.end(err)
	case b.closed:
		b.end(errBodyAbandoned)
	}
	return n, err
}

func (b *bodyTracker) read(p []byte) (n int, err error) {
	defer b.panics.Recover("request body", &err, nil)
	return b.r.Read(p)
}

// Close does not close the client's body: that would wait for a Read in
// progress, which only the client (or finish's deadline) ends.
func (b *bodyTracker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if !b.reading {
		b.end(errBodyAbandoned)
	}
	return nil
}

func (b *bodyTracker) end(err error) {
	if !b.over {
		b.over = true
		b.done <- err
	}
}

// finish waits for the goroutine sending the request body, if any, and
// reports whether the body went out whole. One still reading the client's
// body when the answer is over means the backend answered before the body
// ended: it is stopped (the client read and the upstream write time out at
// once), and neither connection can carry another request. One that read
// the client's body whole is at most writing its tail upstream (the
// backend may well have answered after reading it): it gets bodyTailWait
// to report.
func (s *h1Conn) finish(body chan error, uc *pool.Conn) bool {
	if body == nil {
		return true
	}
	select {
	case err := <-body:
		// net/http's Transport may have given up on the body (an early
		// answer): what the client still sends is unread, and the close
		// must linger for the answer to reach it.
		s.unread = s.unread || err != nil && s.sent.unread()
		return err == nil
	default:
	}
	if s.sent.eof.Load() && uc != nil {
		t := time.NewTimer(bodyTailWait)
		select {
		case err := <-body:
			t.Stop()
			return err == nil
		case <-t.C:
			uc.SetWriteDeadline(aLongTimeAgo)
			<-body
			return false
		}
	}
	if s.cont != nil {
		s.cont.halt()
	}
	s.unread = true
	s.setDeadline(aLongTimeAgo, false)
	if uc != nil {
		uc.SetWriteDeadline(aLongTimeAgo)
	}
	<-body
	return false
}

var aLongTimeAgo = time.Unix(1, 0)

// bodyTailWait bounds how long finish waits for the last bytes of a
// request body, read whole from the client, to be written upstream: a
// backend that answered without reading them may never take them.
const bodyTailWait = time.Second

// sentBody is a request body being written upstream by a goroutine; eof
// is set once the client's side of it was read to its end, broken when
// reading it failed on its own (the app left in the middle of it, or sent
// a malformed one) rather than because finish stopped it, heard once the
// answer's first byte came. An h1Conn keeps one and reuses it.
type sentBody struct {
	io.ReadCloser
	eof, broken, heard atomic.Bool
	// err is why it broke, written before broken is set.
	err error
	// on is set while it tracks the current request's body: from send,
	// until the next request, or until a try that is retried ended
	// (forward), which the retry's send tracks again.
	on bool
	// stall watches its reads from the app, if set.
	stall *stallWatch
	// reads counts its reads from the app twice, as each starts and as
	// it returns: odd while one is under way. looked is the count when
	// the client watch last asked stuck.
	reads  atomic.Uint64
	looked uint64
}

// track makes the body in *body report its end on s, its reads watched
// by stall unless nil.
func (s *sentBody) track(body *io.ReadCloser, stall *stallWatch) {
	s.on, s.stall = true, stall
	s.looked = 1 // odd: the first stuck only takes note
	s.eof.Store(false)
	s.broken.Store(false)
	s.heard.Store(false)
	if *body != s {
		s.ReadCloser = *body
		*body = s
	}
}

// unread reports whether the current request's body is being sent and
// the client's side of it was not read to its end.
func (s *sentBody) unread() bool { return s.on && !s.eof.Load() }

// failed reports whether reading the current request's body broke.
func (s *sentBody) failed() bool { return s.on && s.broken.Load() }

// stranded reports whether the current request's body broke before any
// answer came: the backend waits for the rest, which will never come, so
// it will not answer either.
func (s *sentBody) stranded() bool { return s.failed() && !s.heard.Load() }

// stuck reports whether no read of the app's body started or ended since
// the last ask, and none is under way: the goroutine sending it waits on
// the backend. The client watch asks, once per look (under its mu), and
// track readies it before the watch starts.
func (s *sentBody) stuck() bool {
	n := s.reads.Load()
	stuck := n == s.looked && n%2 == 0
	s.looked = n
	return stuck
}

func (s *sentBody) Read(p []byte) (int, error) {
	s.reads.Add(1)
	if s.stall != nil {
		s.stall.begin()
	}
	n, err := s.ReadCloser.Read(p)
	s.reads.Add(1)
	if s.stall != nil {
		err = s.stall.done(n, err)
	}
	switch {
	case err == io.EOF:
		s.eof.Store(true)
	case err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, errBodyAbandoned):
		// A body is read without a deadline (readRequest): finish's
		// deadline and halt are the only others.
		s.err = err
		s.broken.Store(true)
	}
	return n, err
}
