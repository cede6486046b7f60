package controlplane

import (
	"errors"
	"fmt"
	"runtime/debug"
)

// panicError is a panic recovered from code that a translation or an
// object reached: a bug, which must cost that translation or that object's
// write, not the node's agent. The agent process serves the node's proxy
// too, and a panic the leader's writes hit on one malformed object would
// restart every node's agent in turn as the Lease moved on.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("panicked: %v", e.value) }

// contain runs f and returns a panic of f's goroutine as a *panicError.
func contain(f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: debug.Stack()}
		}
	}()
	return f()
}

// stackAttrs are the log attributes that say where err panicked, if it
// did.
func stackAttrs(err error) []any {
	var p *panicError
	if errors.As(err, &p) {
		return []any{"stack", string(p.stack)}
	}
	return nil
}
