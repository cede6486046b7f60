package upstream

import (
	"context"
	"net"
	"sync"
	"time"
)

// streamWaits bounds the waits for a stream of the requests net/http's
// HTTP/2 Transport gave one connection (connTry.awaitStream), each by
// Config.ConnWait, with one timer for them all: a timer per request cost
// each request about 500 ns and three allocations (BenchmarkH2StreamWait)
// for a wait that, but in one case (design.md), lasts the microseconds
// from the connection given to the HEADERS written. Waits are listed in
// the order they began, the order their bounds pass in; the timer, armed
// while the list is not empty, fires when the first's passes, ends those
// past theirs, and is armed again for the next.
type streamWaits struct {
	mu          sync.Mutex
	first, last *connTry
	timer       *time.Timer
	armed       bool
}

// waitsOf returns the streamWaits of c, a connection the Transport gave a
// request (h2pool's), or nil for one of no h2pool.
func waitsOf(c net.Conn) *streamWaits {
	switch c := c.(type) {
	case *h2Conn:
		return &c.waits
	case h2TLSConn:
		return &c.waits
	}
	return nil
}

// add lists t's wait, which ends, unless removed before, at until with
// t.cancel's errNoStream. t.mu is held.
func (s *streamWaits) add(t *connTry, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t.listed, t.until, t.end = true, until, t.cancel
	t.prev, t.next = s.last, nil
	if s.last != nil {
		s.last.next = t
	} else {
		s.first = t
	}
	s.last = t
	if s.armed {
		return // for a wait listed before, whose bound passes first
	}
	s.armed = true
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(until), s.expire)
	} else {
		s.timer.Reset(time.Until(until))
	}
}

// remove unlists t's wait unless its bound passed: exactly one of remove
// and expire ends it. t.mu is held.
func (s *streamWaits) remove(t *connTry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.listed {
		s.unlink(t)
	}
}

// unlink takes t out of the list. s.mu is held.
func (s *streamWaits) unlink(t *connTry) {
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		s.first = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		s.last = t.prev
	}
	t.prev, t.next, t.listed, t.end = nil, nil, false, nil
}

// expire ends the waits whose bound passed, and arms the timer for the
// next.
func (s *streamWaits) expire() {
	s.mu.Lock()
	now := time.Now()
	var ended []context.CancelCauseFunc
	for s.first != nil && !s.first.until.After(now) {
		ended = append(ended, s.first.end)
		s.unlink(s.first)
	}
	if s.armed = s.first != nil; s.armed {
		s.timer.Reset(s.first.until.Sub(now))
	}
	s.mu.Unlock()
	for _, end := range ended {
		end(errNoStream)
	}
}
