package controlplane

import (
	"cmp"
	"slices"
	"strings"
	"time"
	"unicode"
)

// Writes is what the write loop holds back now, for sockmeshctl status:
// the warning each hold logs once is easily missed, and its metrics name
// no object.
type Writes struct {
	// Writing: this agent writes status and generated Services now, as
	// the leader (or with no leader election). An agent that does not
	// holds nothing back: the rest is empty.
	Writing bool `json:"writing"`
	// RBAC are the resources, each in a namespace, held back because RBAC
	// refuses the agent's writes; Backoff the objects retried alone with
	// backoff. Each lists at most HeldListed, by namespace, resource and
	// name, and its More counts the others: a cluster-wide problem holds
	// back thousands of objects.
	RBAC        []HeldResource `json:"rbac,omitempty"`
	RBACMore    int            `json:"rbacMore,omitempty"`
	Backoff     []HeldObject   `json:"backoff,omitempty"`
	BackoffMore int            `json:"backoffMore,omitempty"`
}

// HeldListed is how many entries each list of Writes holds at most.
const HeldListed = 20

// HeldResource is a resource, in a namespace, that RBAC refuses the agent
// to write (Object without a name).
type HeldResource struct {
	Object
	// Since is when an access review first refused it, this term;
	// Recheck is when the next is asked, at the first write after then.
	Since   time.Time `json:"since"`
	Recheck time.Time `json:"recheck"`
}

// HeldObject is an object whose writes failed about it alone (an admission
// webhook the API server could not call, a conflict), retried by itself.
type HeldObject struct {
	// Object is the last write's (the create or update of a Service).
	Object
	// Error is the last write's, cut to 512 bytes.
	Error string `json:"error"`
	// Attempts counts the writes that failed in a row; Retry is when the
	// next goes.
	Attempts int       `json:"attempts"`
	Retry    time.Time `json:"retry"`
}

// maxErrorText bounds HeldObject.Error: an API server's message may quote
// a webhook's answer at any length.
const maxErrorText = 512

// Writes returns what the write loop holds back now; nil for an agent with
// no writers (the file source). It is safe to call from any goroutine.
func (c *ControlPlane) Writes() *Writes {
	if len(c.cfg.Writers) == 0 {
		return nil
	}
	g := c.gate.Load()
	if g == nil {
		return &Writes{}
	}
	w := g.held(HeldListed)
	return &w
}

// held returns what g holds back now, at most limit entries a list.
func (g *Gate) held(limit int) Writes {
	w := Writes{Writing: true}
	g.mu.Lock()
	for k, r := range g.reviewed {
		if !r.allowed {
			w.RBAC = append(w.RBAC, HeldResource{Object: k, Since: r.since, Recheck: r.until})
		}
	}
	for _, h := range g.failed {
		w.Backoff = append(w.Backoff, HeldObject{Object: h.o, Error: h.err, Attempts: h.attempts, Retry: h.until})
	}
	g.mu.Unlock()
	slices.SortFunc(w.RBAC, func(a, b HeldResource) int { return compareObjects(a.Object, b.Object) })
	slices.SortFunc(w.Backoff, func(a, b HeldObject) int { return compareObjects(a.Object, b.Object) })
	w.RBAC, w.RBACMore = cut(w.RBAC, limit)
	w.Backoff, w.BackoffMore = cut(w.Backoff, limit)
	return w
}

func compareObjects(a, b Object) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.GroupResource(), b.GroupResource()),
		cmp.Compare(a.Name, b.Name), cmp.Compare(a.Verb, b.Verb))
}

// cut returns the first limit of s and how many it left out.
func cut[T any](s []T, limit int) ([]T, int) {
	if len(s) <= limit {
		return s, 0
	}
	return s[:limit], len(s) - limit
}

// errorText is err's message on one line (a webhook's answer may hold
// tabs and newlines, which would break sockmeshctl's table), cut to
// maxErrorText bytes.
func errorText(err error) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, err.Error())
	if len(s) <= maxErrorText {
		return s
	}
	return strings.ToValidUTF8(s[:maxErrorText], "") + "…"
}
