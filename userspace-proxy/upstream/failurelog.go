package upstream

import (
	"errors"
	"log/slog"
	"time"

	"github.com/sockmesh/sockmesh/agent/snapshot"
	"github.com/sockmesh/sockmesh/internal/logthrottle"
)

// FailureLog sets the level of the proxy's failure log lines, written per
// request or connection, so that neither a broken policy nor a failing
// backend floods the node's log: a fail-closed backend is logged loudly
// once per snapshot (Backend.FirstFailure), other failures once per period
// and kind; the rest go to Debug. Metrics count every failure regardless.
type FailureLog struct {
	t *logthrottle.Throttle[FailureKey]
}

// FailureKey is a kind of failure.
type FailureKey struct {
	Service snapshot.ObjectRef
	Backend snapshot.BackendRef
	Path    string // the L4 path's; empty for requests
	Reason  Reason
}

// NewFailureLog returns a FailureLog that logs a kind at most once per
// every.
func NewFailureLog(every time.Duration) *FailureLog {
	return &FailureLog{t: logthrottle.New[FailureKey](every)}
}

// Level returns the level of the line for a failure of kind k with err
// (be may be nil), and how many lines of k went to Debug since the last at
// Warn.
func (l *FailureLog) Level(k FailureKey, be *Backend, err error) (lvl slog.Level, held uint64) {
	if _, ok := errors.AsType[*FailClosedError](err); ok {
		if be != nil && !be.FirstFailure() {
			return slog.LevelDebug, 0
		}
		return slog.LevelWarn, 0
	}
	ok, held := l.t.Allow(k, time.Now())
	if !ok {
		return slog.LevelDebug, 0
	}
	return slog.LevelWarn, held
}

// PolicyAttrs name, for the log line of a failure of reason with err, the
// policy an operator has to look at: a fail-closed backend's invalid one
// and why, or the one whose TLS settings (BackendTLSPolicy, XBackend) a
// failed certificate verification or handshake used. be may be nil.
func PolicyAttrs(be *Backend, reason Reason, err error) []slog.Attr {
	if fc, ok := errors.AsType[*FailClosedError](err); ok {
		return []slog.Attr{slog.String("policy", fc.Policy.String()), slog.String("policy_reason", fc.Reason)}
	}
	if (reason == ReasonTLSVerify || reason == ReasonTLSHandshake) && be != nil && be.Spec.TLS != nil {
		return []slog.Attr{slog.String("policy", be.Spec.TLS.Policy.String())}
	}
	return nil
}
