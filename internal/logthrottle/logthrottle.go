// Package logthrottle bounds how often log lines of one kind are written:
// per key, a line passes, and the next ones within a period are held back
// and counted, the count riding on the next line that passes. The node's
// proxy logs failures per request or connection, and one broken backend
// must not flood the node's log with them (metrics count every failure).
package logthrottle

import (
	"sync"
	"time"
)

// maxKeys bounds the keys remembered; past it, keys whose period has
// passed are forgotten (with their held-back counts).
const maxKeys = 4096

// Throttle lets one line per key through per period; safe for concurrent
// use.
type Throttle[K comparable] struct {
	every time.Duration
	mu    sync.Mutex
	keys  map[K]*entry
}

type entry struct {
	next time.Time // when the next line may pass
	held uint64    // lines held back since the last that passed
}

// New returns a Throttle that lets a key's line through at most once per
// every.
func New[K comparable](every time.Duration) *Throttle[K] {
	return &Throttle[K]{every: every, keys: make(map[K]*entry)}
}

// Allow reports whether a line for k may be written at now and, when it
// may, how many of k's lines were held back since the last one.
func (t *Throttle[K]) Allow(k K, now time.Time) (ok bool, held uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.keys[k]
	if e == nil {
		if len(t.keys) >= maxKeys {
			t.forget(now)
		}
		t.keys[k] = &entry{next: now.Add(t.every)}
		return true, 0
	}
	if now.Before(e.next) {
		e.held++
		return false, 0
	}
	held = e.held
	e.next, e.held = now.Add(t.every), 0
	return true, held
}

// forget drops the keys whose period has passed.
func (t *Throttle[K]) forget(now time.Time) {
	for k, e := range t.keys {
		if !now.Before(e.next) {
			delete(t.keys, k)
		}
	}
}
