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
	ns *NS
	// list reads the namespace's addresses (NS.Addrs).
	list    func() ([]netip.Addr, error)
	log     *slog.Logger
	mu      sync.Mutex
	addrs   []netip.Addr
	changed chan struct{}
}

// WatchAddrs reads n's addresses and returns a watch that Run keeps
// current; n must stay open while Run runs. Reads that changes kept
// interrupting are read again, as Run's are, until one completes; it fails
// when none has within firstReadWithin, or when ctx ends first.
func (n *NS) WatchAddrs(ctx context.Context, log *slog.Logger) (*AddrWatch, error) {
	w := &AddrWatch{ns: n, list: n.Addrs, log: log.With("component", "nodeaddrs"), changed: make(chan struct{}, 1)}
	ctx, cancel := context.WithTimeoutCause(ctx, firstReadWithin,
		fmt.Errorf("addresses kept changing while read for %s", firstReadWithin))
	defer cancel()
	if _, err := w.settle(ctx, &addrSub{}); err != nil {
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

// firstReadWithin bounds WatchAddrs's reads: generous, as the agent cannot
// start without the node's addresses, and its changes end (a node adding
// an address per Service, a CNI adding links for starting pods).
const firstReadWithin = time.Minute

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
// again (settle).
func (w *AddrWatch) follow(ctx context.Context) error {
	s := &addrSub{updates: make(chan netlink.AddrUpdate, 64), ns: w.ns.Path()}
	done := make(chan struct{})
	err := w.ns.Do(func() error {
		return netlink.AddrSubscribeWithOptions(s.updates, done, netlink.AddrSubscribeOptions{
			ErrorCallback: func(err error) { s.err = err },
		})
	})
	if err != nil {
		return fmt.Errorf("subscribe to address changes in netns %s: %w", w.ns.Path(), err)
	}
	defer func() {
		// The subscription's goroutine ends once it sees done, having
		// closed updates; until then it may be sending.
		close(done)
		for range s.updates {
		}
	}()
	for err == nil {
		var changed bool
		if changed, err = w.settle(ctx, s); changed {
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
		if err == nil {
			err = s.next(ctx, nil)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// settle reads the addresses until a read completes, and reports whether
// they changed. A read that changes interrupted (netlink's dump
// inconsistent) is read again after the next change s announces, which
// that read sees, or after rereadAfter: a link's arrival or departure
// can interrupt it as well (the kernel's address dump checks the
// namespace's link generation too) and is announced to link subscribers
// only — though on Linux 6.18, 600 links added and removed interrupted
// none of 1,170 reads of 2,048 addresses under way (TestSettle reads
// through a list that says so instead). The partial list of an
// interrupted read is never used: an address missing from it would stop
// counting as the namespace's.
func (w *AddrWatch) settle(ctx context.Context, s *addrSub) (bool, error) {
	for {
		changed, err := w.read()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return changed, err
		}
		w.log.Debug("node addresses changed while read; reading again", "err", err)
		if werr := s.next(ctx, time.After(rereadAfter)); werr != nil {
			if ctx.Err() != nil { // given up: say on what
				return false, fmt.Errorf("%w: %w", werr, err)
			}
			return false, werr
		}
	}
}

// addrSub is a subscription to a namespace's address changes; the zero
// value, before one, announces none.
type addrSub struct {
	updates chan netlink.AddrUpdate
	err     error  // the subscription's last error, set before updates closes
	ns      string // the namespace's path, for that error
}

// next waits for the next announced change, or for after (nil: none), and
// takes those queued with it: one read covers them all (kube-proxy adds an
// address per Service to kube-ipvs0). It fails when ctx ends (its cause)
// or the subscription does.
func (s *addrSub) next(ctx context.Context, after <-chan time.Time) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-after:
	case _, ok := <-s.updates:
		if !ok {
			return fmt.Errorf("address changes in netns %s: %w", s.ns, s.err)
		}
	}
	for len(s.updates) > 0 {
		<-s.updates
	}
	return nil
}

// read reads the addresses and reports whether they differ from the last
// read.
func (w *AddrWatch) read() (bool, error) {
	all, err := w.list()
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
