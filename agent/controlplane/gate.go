package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
)

// Object names the object of one write as the API server authorizes it.
type Object struct {
	Verb        string `json:"verb,omitempty"` // create, update, patch, delete
	Group       string `json:"group,omitempty"`
	Resource    string `json:"resource"`              // plural, as RBAC names it
	Subresource string `json:"subresource,omitempty"` // status for a status patch
	Namespace   string `json:"namespace,omitempty"`   // empty for a cluster-scoped object
	// Name is the object's name, or its generateName for a create.
	Name string `json:"name,omitempty"`
}

// resource is o as an RBAC rule grants it: without its name.
func (o Object) resource() Object {
	o.Name = ""
	return o
}

// key is o as backoff tracks it: the create and the later update of a
// Service are writes of one object.
func (o Object) key() Object {
	o.Verb = ""
	return o
}

// GroupResource names o's resource as RBAC rules and logs do:
// "backendtlspolicies/status.gateway.networking.k8s.io".
func (o Object) GroupResource() string {
	r := o.Resource
	if o.Subresource != "" {
		r += "/" + o.Subresource
	}
	if o.Group != "" {
		r += "." + o.Group
	}
	return r
}

// attrs are o's log attributes.
func (o Object) attrs() []any {
	return []any{"verb", o.Verb, "resource", o.GroupResource(), "namespace", o.Namespace, "name", o.Name}
}

// AccessFunc reports whether this agent may make the write of o, as the
// API server's authorizer answers now. The Gate holds o's whole resource
// (in o's namespace) back on a no: RBAC grants the agent's writes by
// resource, since it cannot name the objects in advance.
type AccessFunc func(ctx context.Context, o Object) (bool, error)

// SelfAccess asks the API server with a SelfSubjectAccessReview, as
// `kubectl auth can-i` does; every authenticated user may create one
// (system:basic-user).
func SelfAccess(c authorizationclient.SelfSubjectAccessReviewsGetter) AccessFunc {
	return func(ctx context.Context, o Object) (bool, error) {
		r, err := c.SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: o.Verb, Group: o.Group, Resource: o.Resource, Subresource: o.Subresource, Namespace: o.Namespace,
				Name: o.Name,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			return false, fmt.Errorf("review access to %s %s/%s: %w", o.Verb, o.Resource, o.Subresource, err)
		}
		return r.Status.Allowed, nil
	}
}

// Gate holds back, for one leader term, the writes that failed in a way
// that resending soon would only repeat. Writers pass each object's write
// through Do; a nil Gate holds nothing back.
//
//   - An object whose write failed in a way that may clear but is about it
//     alone (objectScoped: an admission webhook the API server could not
//     call, a conflict RetryOnConflict gave up on), or panicked (a bug its
//     data reached), is retried alone, after RetryInterval, doubling up to
//     a minute; the loop writes the latest translation then, so the retry
//     needs no change of the object.
//   - A resource (in a namespace) that RBAC refused is written again only
//     once an access review says the agent may: one is asked per
//     AccessRecheck. RBAC changes bring no watch event the agent sees, and
//     what it withholds is status, so minutes' delay after an
//     administrator grants the right is cheap, where a refused request per
//     object and translation is not. A new term starts with a new Gate, so
//     an agent that takes over tries at once.
type Gate struct {
	c *ControlPlane
	// review serialises access reviews, so that the objects of one resource
	// refused at once cost one review and one warning.
	review   sync.Mutex
	mu       sync.Mutex
	failed   map[Object]*hold   // by Object.key
	reviewed map[Object]*review // by Object.resource
	// firsts are closed once the first write of a resource (by
	// Object.resource) in the term has ended, which the others wait for:
	// a refusal of RBAC's costs one request, not the writers' parallel ones.
	firsts map[Object]chan struct{}
}

// hold is a wait before an object's next write: until when, and how long
// it was; and, for Writes, the last write's object and error and how many
// failed in a row.
type hold struct {
	until    time.Time
	wait     time.Duration
	o        Object
	err      string
	attempts int
}

// review is an access review's answer, trusted until AccessRecheck has
// passed: a resource RBAC refuses is held back until then, and a 403 in
// one it allows is its object's (a quota, a webhook) without a review of
// each.
type review struct {
	allowed bool
	until   time.Time
	// since is when a review first refused the resource in a row of
	// refusals (zero while allowed).
	since time.Time
}

func (c *ControlPlane) newGate() *Gate {
	return &Gate{c: c, failed: map[Object]*hold{}, reviewed: map[Object]*review{}, firsts: map[Object]chan struct{}{}}
}

// Do runs write, the write of o, unless the Gate holds o back. It returns
// nil when write succeeded, was held back or failed in a way the Gate took
// over (o retried alone, or its resource held back until RBAC allows it);
// else write's error, for the loop: a refusal of o alone, or trouble of
// the API server's that backs every write off. A panic of write's is an
// error, never the agent's end: a nil Gate returns it, a Gate retries o
// alone.
func (g *Gate) Do(ctx context.Context, o Object, write func(context.Context) error) error {
	if g == nil {
		return contain(func() error { return write(ctx) })
	}
	if !g.open(ctx, o) {
		return nil
	}
	g.mu.Lock()
	first, later := g.firsts[o.resource()]
	if !later {
		first = make(chan struct{})
		g.firsts[o.resource()] = first
		defer close(first)
	}
	g.mu.Unlock()
	if later {
		select {
		case <-first:
		case <-ctx.Done():
			return ctx.Err()
		}
		if !g.open(ctx, o) {
			return nil
		}
	}
	err := contain(func() error { return write(ctx) })
	var p *panicError
	switch {
	case err == nil:
		g.mu.Lock()
		delete(g.failed, o.key())
		g.mu.Unlock()
	case errors.As(err, &p):
		// A bug that o's data reached (the merge of its status, say): it
		// would panic again at once, and it is o's alone.
		g.retryAlone(o, err)
		return nil
	case every(err, apierrors.IsForbidden) && g.deny(ctx, o, err):
		return nil
	case objectScoped(err):
		g.retryAlone(o, err)
		return nil
	}
	return err
}

// open reports whether o may be written now. A resource held back past its
// re-check is reviewed again first.
func (g *Gate) open(ctx context.Context, o Object) bool {
	now := time.Now()
	g.mu.Lock()
	f, failed := g.failed[o.key()]
	r := g.reviewed[o.resource()]
	g.mu.Unlock()
	switch {
	case failed && now.Before(f.until):
		return false
	case r == nil || r.allowed:
		return true
	case now.Before(r.until):
		return false
	}
	g.review.Lock()
	defer g.review.Unlock()
	g.mu.Lock()
	r = g.reviewed[o.resource()]
	g.mu.Unlock()
	if r == nil || r.allowed || now.Before(r.until) {
		// Reviewed meanwhile by another write.
		return r == nil || r.allowed
	}
	allowed, err := g.c.cfg.Access(ctx, o)
	if err != nil {
		// Unknown: the write itself tells.
		g.c.log.Debug("access review failed; writing again", "err", err)
		allowed = true
	}
	g.remember(o, allowed)
	if allowed {
		g.c.log.Info("write allowed by rbac again; resuming", o.resource().attrs()...)
	}
	return allowed
}

// deny holds o's resource back if RBAC refused err, o's write, and reports
// whether it did; a 403 that RBAC would allow (a quota's, an admission
// webhook's) is about o alone.
func (g *Gate) deny(ctx context.Context, o Object, err error) bool {
	if g.c.cfg.Access == nil {
		return false
	}
	g.review.Lock()
	defer g.review.Unlock()
	g.mu.Lock()
	r := g.reviewed[o.resource()]
	g.mu.Unlock()
	switch {
	case r != nil && time.Now().Before(r.until) && r.allowed:
		return false
	case r != nil && time.Now().Before(r.until):
		// Refused while another write's review ran: counted, not logged.
	default:
		allowed, rerr := g.c.cfg.Access(ctx, o)
		if rerr != nil {
			g.c.log.Debug("access review failed; the refusal is taken as the object's", "err", rerr)
			return false
		}
		g.remember(o, allowed)
		if allowed {
			return false
		}
		g.c.log.Warn("write refused by rbac; the resource is held back until allowed",
			append(o.resource().attrs(), "recheck", g.c.cfg.AccessRecheck, "err", err)...)
	}
	g.c.m.writeRefusals.WithLabelValues("rbac").Inc()
	return true
}

// remember keeps a review's answer for o's resource for AccessRecheck.
func (g *Gate) remember(o Object, allowed bool) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	r := &review{allowed: allowed, until: now.Add(g.c.cfg.AccessRecheck)}
	if !allowed {
		r.since = now
		if old := g.reviewed[o.resource()]; old != nil && !old.allowed {
			r.since = old.since
		}
	}
	g.reviewed[o.resource()] = r
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
	h.o, h.err = o, errorText(err)
	h.attempts++
	g.c.m.writeErrors.WithLabelValues("object").Inc()
	level := slog.LevelWarn
	if again {
		// One warning per object, not one a minute while it fails.
		level = slog.LevelDebug
	}
	stack := stackAttrs(err)
	if stack != nil {
		// A bug, not the API server's answer: an error each time, with
		// where it struck.
		level = slog.LevelError
	}
	g.c.log.Log(context.Background(), level, "write failed; retrying the object alone",
		append(append(o.attrs(), "retry_in", h.wait, "err", err), stack...)...)
}

// endPass forgets the holds and reviews that were due when a pass began
// and that it did not renew: a hold's objects are gone from the
// translation, and a review is stale.
func (g *Gate) endPass(start time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, h := range g.failed {
		if !h.until.After(start) {
			delete(g.failed, k)
		}
	}
	for k, r := range g.reviewed {
		if !r.until.After(start) {
			delete(g.reviewed, k)
		}
	}
}

// next returns when the first hold ends (zero: none is held).
func (g *Gate) next() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	var first time.Time
	earlier := func(t time.Time) {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	for _, h := range g.failed {
		earlier(h.until)
	}
	for _, r := range g.reviewed {
		if !r.allowed {
			earlier(r.until)
		}
	}
	return first
}
