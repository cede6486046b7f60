package podns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// TestSettle: a read of the addresses that a change interrupted, with no
// change announced after it (a link's arrival, which address subscribers
// do not hear of), is read again after rereadAfter, and the addresses are
// those of the read that completed; reads interrupted until the context
// ends (WatchAddrs's minute) fail with its cause and the interruption.
func TestSettle(t *testing.T) {
	const hangGuard = 20 * time.Second // not a bound: three rereads take 0.3 s
	own := netip.MustParseAddr("10.216.0.1")
	watch := func(interrupted int) (*AddrWatch, *int) {
		reads := 0
		return &AddrWatch{log: slog.New(slog.DiscardHandler), list: func() ([]netip.Addr, error) {
			if reads++; reads <= interrupted {
				return nil, fmt.Errorf("list addresses: %w", netlink.ErrDumpInterrupted)
			}
			return []netip.Addr{own, netip.MustParseAddr("fe80::1")}, nil
		}}, &reads
	}

	t.Run("read again", func(t *testing.T) {
		w, reads := watch(3)
		ctx, cancel := context.WithTimeoutCause(t.Context(), hangGuard, errors.New("no read again without an announced change"))
		defer cancel()
		changed, err := w.settle(ctx, &addrSub{})
		if err != nil || !changed {
			t.Fatalf("settle() = %v, %v after %d reads, want true, nil", changed, err, *reads)
		}
		if *reads != 4 || !slices.Equal(w.Addrs(), []netip.Addr{own}) {
			t.Errorf("%d reads, addresses %v; want 4 reads, [%s]", *reads, w.Addrs(), own)
		}
	})

	t.Run("given up", func(t *testing.T) {
		w, reads := watch(1 << 30)
		cause := errors.New("addresses kept changing")
		ctx, cancel := context.WithTimeoutCause(t.Context(), 3*rereadAfter/2, cause)
		defer cancel()
		_, err := w.settle(ctx, &addrSub{})
		if !errors.Is(err, cause) || !errors.Is(err, netlink.ErrDumpInterrupted) {
			t.Errorf("settle() = %v after %d reads, want %q and the interruption", err, *reads, cause)
		}
		if w.Addrs() != nil {
			t.Errorf("an interrupted read's addresses were kept: %v", w.Addrs())
		}
	})
}
