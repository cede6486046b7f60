package httpproxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sockmesh/sockmesh/userspace-proxy/contain"
	"github.com/sockmesh/sockmesh/userspace-proxy/upstream"
)

// Request bodies on the fast path: held back until 100 Continue, and
// watched while net/http's Transport reads them.

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
		s.wmu.Lock()
		var err error
		if !s.answered {
			// Watched: an app that reads none of it would hold the
			// exchange, and its upstream connection, for good.
			_, err = io.WriteString(&s.out, continueLine)
		}
		s.wmu.Unlock()
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
	s.wmu.Lock()
	defer s.wmu.Unlock()
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
