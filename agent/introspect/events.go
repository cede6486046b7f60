package introspect

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Event is one warning or error a component logged.
type Event struct {
	Time  time.Time `json:"time"`
	Level string    `json:"level"`
	// Component is the logger's "component" attribute (datapath, proxy,
	// controlplane, enrol, ...).
	Component string `json:"component,omitempty"`
	Message   string `json:"message"`
	// Attrs are the record's other attributes, group names joined with dots.
	Attrs map[string]string `json:"attrs,omitempty"`
}

// DefaultEventCapacity is the number of events NewEvents keeps when asked
// for 0.
const DefaultEventCapacity = 100

// Events keeps the most recent warnings and errors, oldest dropped first.
// It is safe for concurrent use.
type Events struct {
	mu    sync.Mutex
	buf   []Event
	next  int // where the next event goes
	total uint64
}

// NewEvents keeps up to capacity events (0: DefaultEventCapacity).
func NewEvents(capacity int) *Events {
	if capacity <= 0 {
		capacity = DefaultEventCapacity
	}
	return &Events{buf: make([]Event, 0, capacity)}
}

// Add records e, dropping the oldest event when full.
func (ev *Events) Add(e Event) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.total++
	if len(ev.buf) < cap(ev.buf) {
		ev.buf = append(ev.buf, e)
		return
	}
	ev.buf[ev.next] = e
	ev.next = (ev.next + 1) % len(ev.buf)
}

// Recent returns the kept events, oldest first, and how many were ever
// added (more than returned once the oldest were dropped).
func (ev *Events) Recent() ([]Event, uint64) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return slices.Concat(ev.buf[ev.next:], ev.buf[:ev.next]), ev.total
}

// Handler returns a slog handler that passes every record to next and also
// keeps those at slog.LevelWarn or above. Records next would drop (below
// its level) are still kept when they are warnings: an operator who runs
// the agent with --log-level=error still sees recent warnings here.
func (ev *Events) Handler(next slog.Handler) slog.Handler {
	return &teeHandler{next: next, events: ev}
}

type teeHandler struct {
	next   slog.Handler
	events *Events
	attrs  []slog.Attr // from WithAttrs, keys already qualified by groups
	group  string      // "a.b." prefix from WithGroup
}

func (h *teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.next.Enabled(ctx, l)
}

func (h *teeHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.events.Add(h.event(r))
	}
	if !h.next.Enabled(ctx, r.Level) {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *teeHandler) event(r slog.Record) Event {
	e := Event{Time: r.Time, Level: r.Level.String(), Message: r.Message}
	add := func(key string, v slog.Value) {
		if key == "component" {
			e.Component = v.String()
			return
		}
		if e.Attrs == nil {
			e.Attrs = make(map[string]string)
		}
		e.Attrs[key] = v.String()
	}
	for _, a := range h.attrs {
		flatten("", a, add)
	}
	r.Attrs(func(a slog.Attr) bool {
		flatten(h.group, a, add)
		return true
	})
	return e
}

// flatten calls add for a and, for a group, for each of its members, with
// keys joined by dots.
func flatten(prefix string, a slog.Attr, add func(string, slog.Value)) {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, m := range v.Group() {
			flatten(p, m, add)
		}
		return
	}
	if a.Key == "" {
		return
	}
	add(prefix+a.Key, v)
}

func (h *teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(as)
	c.attrs = slices.Clone(h.attrs)
	for _, a := range as {
		if h.group != "" {
			a = slog.Attr{Key: h.group + a.Key, Value: a.Value}
		}
		c.attrs = append(c.attrs, a)
	}
	return &c
}

func (h *teeHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.next = h.next.WithGroup(name)
	c.group = h.group + name + "."
	return &c
}
