package controlplane

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Object names the object of one write as the API server authorizes it.
type Object struct {
	Verb        string // create, update, patch, delete
	Group       string
	Resource    string // plural, as RBAC names it
	Subresource string // status for a status patch
	Namespace   string // empty for a cluster-scoped object
	// Name is the object's name, or its generateName for a create.
	Name string
}

// key is o as backoff tracks it: the create and the later update of a
// Service are writes of one object.
func (o Object) key() Object {
	o.Verb = ""
	return o
}

// attrs are o's log attributes.
func (o Object) attrs() []any {
	r := o.Resource
	if o.Subresource != "" {
		r += "/" + o.Subresource
	}
	if o.Group != "" {
		r += "." + o.Group
	}
	return []any{"verb", o.Verb, "resource", r, "namespace", o.Namespace, "name", o.Name}
}

// Gate holds back, for one leader term, the writes that failed in a way
// that resending soon would only repeat. Writers pass each object's write
// through Do; a nil Gate holds nothing back. An object whose write failed
// in a way that may clear but is about it alone (objectScoped: an
// admission webhook the API server could not call, a conflict
// RetryOnConflict gave up on) is retried alone, after RetryInterval,
// doubling up to a minute; the loop writes the latest translation then, so
// the retry needs no change of the object.
type Gate struct {
	c      *ControlPlane
	mu     sync.Mutex
	failed map[Object]*hold // by Object.key
}

// hold is a wait before the next write: until when, and how long it was.
type hold struct {
	until time.Time
	wait  time.Duration
}

func (c *ControlPlane) newGate() *Gate {
	return &Gate{c: c, failed: map[Object]*hold{}}
}

// Do runs write, the write of o, unless the Gate holds o back. It returns
// nil when write succeeded, was held back or failed in a way the Gate took
// over (o retried alone); else write's error, for the loop: a refusal of o
// alone, or trouble of the API server's that backs every write off.
func (g *Gate) Do(ctx context.Context, o Object, write func(context.Context) error) error {
	if g == nil {
		return write(ctx)
	}
	g.mu.Lock()
	f, failed := g.failed[o.key()]
	g.mu.Unlock()
	if failed && time.Now().Before(f.until) {
		return nil
	}
	err := write(ctx)
	switch {
	case err == nil:
		g.mu.Lock()
		delete(g.failed, o.key())
		g.mu.Unlock()
	case objectScoped(err):
		g.retryAlone(o, err)
		return nil
	}
	return err
}

// retryAlone backs o off for its next write: RetryInterval after its first
// failure, doubling up to a minute.
func (g *Gate) retryAlone(o Object, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	h, again := g.failed[o.key()]
	if !again {
		h = &hold{wait: g.c.cfg.RetryInterval}
		g.failed[o.key()] = h
	} else {
		h.wait = min(h.wait*2, time.Minute)
	}
	h.until = time.Now().Add(h.wait)
	g.c.m.writeErrors.WithLabelValues("object").Inc()
	level := slog.LevelWarn
	if again {
		// One warning per object, not one a minute while it fails.
		level = slog.LevelDebug
	}
	g.c.log.Log(context.Background(), level, "write failed; retrying the object alone",
		append(o.attrs(), "retry_in", h.wait, "err", err)...)
}

// endPass forgets the holds that were due when a pass began and that it
// did not renew: their objects are gone from the translation.
func (g *Gate) endPass(start time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, h := range g.failed {
		if !h.until.After(start) {
			delete(g.failed, k)
		}
	}
}

// next returns when the first hold ends (zero: none is held).
func (g *Gate) next() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	var first time.Time
	for _, h := range g.failed {
		if first.IsZero() || h.until.Before(first) {
			first = h.until
		}
	}
	return first
}
