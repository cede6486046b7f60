package podns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// AddrWatch keeps a namespace's global unicast addresses (of Addrs) current:
// the agent's own namespace's are the node's, which ExternalHostname answers
// must not lead to, and a node gains and loses addresses (a secondary IP, a
// new interface) while the agent runs.
type AddrWatch struct {
	ns      *NS
	log     *slog.Logger
	mu      sync.Mutex
	addrs   []netip.Addr
	changed chan struct{}
}

// WatchAddrs reads n's addresses and returns a watch that Run keeps
// current; n must stay open while Run runs.
func (n *NS) WatchAddrs(log *slog.Logger) (*AddrWatch, error) {
	w := &AddrWatch{ns: n, log: log.With("component", "nodeaddrs"), changed: make(chan struct{}, 1)}
	if _, err := w.read(); err != nil {
		return nil, err
	}
	return w, nil
}

// Addrs returns the addresses last read.
func (w *AddrWatch) Addrs() []netip.Addr {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.addrs
}

// Changed receives a value after Addrs changes (not for the first read).
func (w *AddrWatch) Changed() <-chan struct{} { return w.changed }

// resubscribeAfter is the pause before subscribing again after a failure.
const resubscribeAfter = time.Second

// rereadAfter is the longest wait for the next read after one the
// namespace's changes interrupted.
const rereadAfter = 100 * time.Millisecond

// loggedAddrs is how many of the addresses a warning names: a node may have
// thousands (kube-ipvs0 aside, a secondary IP per pod on some clouds).
const loggedAddrs = 4

// Run follows the namespace's address changes until ctx ends, re-reading
// the whole list (Addrs, which alone decides which addresses count) after
// each burst of them; it returns nil then. A failed subscription or read
// (the kernel drops a lagging subscriber's messages with ENOBUFS) must not
// stop the agent: it is logged, the addresses last read stay, and Run
// subscribes again and re-reads, which catches up with what it missed.
func (w *AddrWatch) Run(ctx context.Context) error {
	for {
		err := w.follow(ctx)
		if err == nil {
			return nil
		}
		addrs := w.Addrs()
		w.log.Warn("node address watch failed; keeping the last addresses and subscribing again",
			"err", err, "addrs", len(addrs), "first_addrs", addrs[:min(len(addrs), loggedAddrs)], "retry_in", resubscribeAfter)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(resubscribeAfter):
		}
	}
}

// follow subscribes, re-reads (a change between the last read and the
// subscription is not lost) and re-reads after each burst of updates until
// ctx ends (nil) or the subscription fails. A read that changes kept
// interrupting is no failure: the addresses are changing, and it reads
// again.
func (w *AddrWatch) follow(ctx context.Context) error {
	updates, done := make(chan netlink.AddrUpdate, 64), make(chan struct{})
	var subErr error // the subscription's last error, set before updates closes
	err := w.ns.Do(func() error {
		return netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{
			ErrorCallback: func(err error) { subErr = err },
		})
	})
	if err != nil {
		return fmt.Errorf("subscribe to address changes in netns %s: %w", w.ns.Path(), err)
	}
	defer func() {
		// The subscription's goroutine ends once it sees done, having
		// closed updates; until then it may be sending.
		close(done)
		for range updates {
		}
	}()
	for {
		var again <-chan time.Time
		switch changed, err := w.read(); {
		case errors.Is(err, netlink.ErrDumpInterrupted):
			// The addresses that interrupted it are announced to this
			// subscription; the read after them sees them. A link's arrival
			// or departure interrupts it as well (the kernel's address dump
			// checks the namespace's link generation too) and is announced
			// to link subscribers only: read again after a pause if nothing
			// comes.
			w.log.Debug("node addresses changed while read; reading again", "err", err)
			again = time.After(rereadAfter)
		case err != nil:
			return err
		case changed:
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-again:
		case _, ok := <-updates:
			if !ok {
				return fmt.Errorf("address changes in netns %s: %w", w.ns.Path(), subErr)
			}
		}
		// One read for what is queued (kube-proxy adds an address per
		// Service to kube-ipvs0).
		for len(updates) > 0 {
			<-updates
		}
	}
}

// read reads the addresses and reports whether they differ from the last
// read.
func (w *AddrWatch) read() (bool, error) {
	all, err := w.ns.Addrs()
	if err != nil {
		return false, err
	}
	var addrs []netip.Addr
	for _, a := range all {
		if a.IsGlobalUnicast() && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	w.mu.Lock()
	defer w.mu.Unlock()
	changed := !slices.Equal(w.addrs, addrs)
	w.addrs = addrs
	return changed, nil
}
