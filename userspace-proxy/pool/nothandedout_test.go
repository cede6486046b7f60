package pool

import (
	"context"
	"errors"
	"net"
	"testing"
	"testing/synctest"
	"time"
)

// TestNotHandedOut: Get's errors tell a caller that got no connection and
// dialed none — its context ended before, or while it waited for one of
// the endpoint's connections, or MaxWait passed, its Client at its share
// or not — from one whose dial failed, and read as their cause.
func TestNotHandedOut(t *testing.T) {
	refused := errors.New("refused")
	get := func(ctx context.Context, p *Pool) error {
		_, err := p.Get(ctx, ep, Client{}, func(context.Context) (net.Conn, error) { return nil, refused })
		return err
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name  string
		share float64 // ClientShare of the pool's two connections
		held  int     // connections the Client holds before the Get
		ctx   func() (context.Context, context.CancelFunc)
		cause error
		dials bool // the Get dials: its error is not ErrNotHandedOut
	}{
		{"ended before", 1, 0, func() (context.Context, context.CancelFunc) { return ended, func() {} }, context.Canceled, false},
		{"ended while waiting", 1, 2, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Second)
		}, context.DeadlineExceeded, false},
		{"MaxWait", 1, 2, func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }, ErrBusy, false},
		{"MaxWait at its share", 0.5, 1, func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }, ErrBusy, false},
		{"dial failed", 1, 1, func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }, refused, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := New(Config{MaxOpen: 2, ClientShare: tc.share, MaxWait: 3 * time.Second})
				d := newPipeDialer()
				for range tc.held {
					if _, err := p.Get(context.Background(), ep, Client{}, d.dial); err != nil {
						t.Fatal(err)
					}
				}
				ctx, cancel := tc.ctx()
				defer cancel()
				err := get(ctx, p)
				if !errors.Is(err, tc.cause) || errors.Is(err, ErrNotHandedOut) == tc.dials {
					t.Errorf("Get = %v; want %v, ErrNotHandedOut %v", err, tc.cause, !tc.dials)
				}
				if err != nil && err.Error() == ErrNotHandedOut.Error() {
					t.Errorf("Get's error reads %q, not its cause", err)
				}
			})
		})
	}
}
