package sandbox

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sockmesh/sockmesh/datapath/podns"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

// lockDir holds the claims' lock files: tmpfs, so a reboot clears it. The
// files are left in place (empty); closing one releases its lock.
const lockDir = "/run/lock"

// claimWait bounds how long ClaimAddrs waits for another run: no result
// depends on it, it only keeps a holder that never ends from hanging the
// test.
const claimWait = 15 * time.Minute

// ClaimAddrs makes prefixes this test's alone on the machine until t ends.
// A test that gives pods fixed addresses owns its range in the repository,
// but a second run of the same test (another checkout, another `go test`
// on the machine) gives out the same ones, and an agent that finds a pod's
// address in two network namespaces enrols neither: the pod's connections
// then go uncaptured. So ClaimAddrs waits while another process holds a
// claim on one of prefixes (an exclusive flock on
// /run/lock/sockmesh-addrs-<prefix>.lock, released when t ends or the
// process dies), then fails t if a network namespace on the machine
// already holds one of their addresses: a leftover of a run that died
// before its cleanups. Call it before making the namespaces that use them.
//
// Claims are by prefix, not by address: every user of a range claims it
// whole, as given. A test must not claim a prefix that it, or a test
// running beside it in the same process, holds: it would wait for itself.
func ClaimAddrs(t TB, prefixes ...netip.Prefix) {
	t.Helper()
	testenv.RequireRoot(t)
	ps := make([]netip.Prefix, len(prefixes))
	for i, p := range prefixes {
		ps[i] = p.Masked()
	}
	// One order for every claimant: two claiming overlapping sets cannot
	// each hold what the other waits for.
	slices.SortFunc(ps, netip.Prefix.Compare)
	ps = slices.Compact(ps)
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		t.Fatalf("create %s: %v", lockDir, err)
	}
	for _, p := range ps {
		f, err := lockAddrs(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		locked, err := tryLock(f)
		if err != nil {
			t.Fatalf("claim %s: %v", p, err)
		}
		if locked {
			continue
		}
		if l, ok := t.(interface{ Logf(string, ...any) }); ok {
			l.Logf("waiting for %s: another run on this machine claims it (%s)", p, f.Name())
		}
		if err := waitLock(f); err != nil {
			t.Fatalf("claim %s: %v", p, err)
		}
	}
	if err := checkUnheld(ps); err != nil {
		t.Fatal(err)
	}
}

// lockAddrs opens the lock file of p.
func lockAddrs(p netip.Prefix) (*os.File, error) {
	name := "sockmesh-addrs-" + strings.NewReplacer(":", "-", "/", "_").Replace(p.String()) + ".lock"
	f, err := os.OpenFile(filepath.Join(lockDir, name), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("claim %s: %w", p, err)
	}
	return f, nil
}

// tryLock takes f's exclusive lock unless another open file holds it.
func tryLock(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		return false, nil
	}
	return false, fmt.Errorf("lock %s: %w", f.Name(), err)
}

// waitLock takes f's exclusive lock, waiting up to claimWait. It asks again
// every 100 ms rather than blocking in flock, which nothing could
// interrupt at the bound.
func waitLock(f *os.File) error {
	deadline := time.Now().Add(claimWait)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		<-tick.C
		locked, err := tryLock(f)
		if locked || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("another run still holds %s after %s", f.Name(), claimWait)
		}
	}
}

// checkUnheld fails when a network namespace on the machine holds an
// address of ps.
func checkUnheld(ps []netip.Prefix) error {
	all, err := podns.List()
	if err != nil {
		return err
	}
	var found []error
	for _, ns := range all {
		// An error means the namespace went away during the scan: it
		// holds nothing.
		addrs, _ := ns.Addrs()
		for _, a := range addrs {
			if slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) }) {
				found = append(found, fmt.Errorf("%s holds %s", ns.Path(), a))
			}
		}
		ns.Close()
	}
	if len(found) > 0 {
		return fmt.Errorf("a run that died left namespaces holding addresses this test claims (remove them: `ip netns del smt-<pid>-<n>`, the pid names the dead process): %w",
			errors.Join(found...))
	}
	return nil
}
