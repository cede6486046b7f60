package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sockmesh/sockmesh/test/childproc"
)

// stopOrder is the order components go down in: the kubelet first so that
// it restarts nothing, containerd after the pods are removed through it,
// the API server and etcd last.
var stopOrder = []struct {
	name  string
	grace time.Duration
}{
	{"kubelet", 5 * time.Second},
	{"kube-proxy", 5 * time.Second},
	{"kube-scheduler", 5 * time.Second},
	{"kube-controller-manager", 5 * time.Second},
	{"containerd", 10 * time.Second},
	// The API server drains watches for up to a minute on SIGTERM; a test
	// node's clients are gone, nothing is worth waiting for.
	{"kube-apiserver", 3 * time.Second},
	{"etcd", 5 * time.Second},
}

// Down stops every component by PID and undoes every host change the
// ledger records, also after a bring-up that failed half-way. It keeps
// going past errors and returns them all; when one remains, Dir and its
// ledger stay so that the next Up (or Clean) tries again. It then reads the
// HostState again and returns an error if it differs from the one Up read
// before its first change.
func (n *Node) Down() error {
	n.downOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		start := time.Now()
		n.downErr = teardown(ctx, n.lay, n.led, n.procs, n.log)
		if n.downErr == nil {
			// Checked while the lock still keeps other nodes away.
			after, err := ReadHostState(ctx, Config{Dir: n.Dir, Binaries: n.Binaries})
			if err != nil {
				n.downErr = err
			} else if d := n.before.Diff(after); len(d) > 0 {
				n.downErr = fmt.Errorf("the machine differs from before the node:\n%s", strings.Join(d, "\n"))
			}
		}
		n.lock.release()
		n.log.Info("node down", "duration", time.Since(start).Round(time.Millisecond).String(), "err", n.downErr)
	})
	return n.downErr
}

// Clean undoes what a node that crashed left on this machine (a ledger in
// cfg.Dir): the same as Down. It does nothing when there is no ledger and
// waits while another node runs.
func Clean(ctx context.Context, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil && !errors.Is(err, ErrMissing) {
		return err
	}
	lock, err := acquireLock(ctx, LockPath)
	if err != nil {
		return err
	}
	defer lock.release()
	return clean(ctx, newLayout(cfg), cfg.Logger.With("component", "node"))
}

// clean undoes an earlier run's ledger, if there is one. The caller holds
// the lock, so that run's owner is gone.
func clean(ctx context.Context, lay *layout, log *slog.Logger) error {
	led, ok, err := loadLedger(filepath.Join(lay.Dir, "state.json"))
	if err != nil {
		return err
	}
	if !ok {
		// Files of a run that died before its first host change, or none.
		return removeTree(lay.Dir)
	}
	log.Info("cleaning up after an earlier run", "owner_pid", led.Owner)
	return teardown(ctx, lay, led, nil, log)
}

// teardown stops the components — live ones (this process's children) by
// their handles, a crashed run's by the PIDs in the ledger — and undoes the
// ledger's host changes.
func teardown(ctx context.Context, lay *layout, led *ledger, live map[string]*childproc.Process, log *slog.Logger) error {
	if led == nil {
		return removeTree(lay.Dir)
	}
	var errs []error
	note := func(step string, err error) {
		if err != nil {
			log.Warn("teardown step failed", "step", step, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", step, err))
		}
	}
	stop := func(name string, grace time.Duration) {
		if p, ok := live[name]; ok {
			note("stop "+name, p.Stop(grace))
		} else if r, ok := led.Procs[name]; ok {
			note("stop "+name, r.kill(grace))
		}
	}
	for _, c := range stopOrder {
		if c.name == "containerd" {
			note("remove pods", removePods(ctx, lay, led, live, log))
		}
		stop(c.name, c.grace)
	}
	note("stop shims", killShims(led.Containerd))
	note("kill pod processes", killPodProcesses(led.Absent))

	if led.IPTables {
		// kube-proxy knows its own rules best; cleanIPTables then removes
		// what it leaves (the kubelet's chains) or could not run for.
		if lay.KubeProxyBin != "" {
			if out, err := exec.CommandContext(ctx, lay.KubeProxyBin, "--cleanup").CombinedOutput(); err != nil {
				log.Warn("kube-proxy cleanup failed", "err", err, "output", string(bytes.TrimSpace(out)))
			}
		}
		note("iptables", cleanIPTables(ctx))
		if led.NFTKnown {
			note("nftables", removeNewEmptyNFTTables(ctx, led.NFTTables))
		}
	}
	note("bridge", deleteBridge(led.Bridge))
	note("netns", removeNewNetns(led.Netns))
	if !led.NetnsDir {
		note("netns dir", removeEmptyNetnsDir())
	}
	note("cni results", removeCNIResults(led.CNINetwork))
	note("container log links", removeLogLinks(lay.PodLogs))
	note("lo address", delLoAddr(led.LoAddr))
	note("sysctls", restoreSysctls(led.Sysctls))
	note("bpffs", undoBPFFS(led))
	for _, p := range led.Absent {
		note("remove "+p, removeAbsent(p))
	}
	if len(errs) > 0 {
		// Keep the ledger for the next attempt.
		return errors.Join(errs...)
	}
	return removeTree(lay.Dir)
}

// removePods removes every pod through containerd's CRI. A crashed run's
// containerd is gone but its shims and pods may live: a containerd started
// on the same root and state finds them again.
func removePods(ctx context.Context, lay *layout, led *ledger, live map[string]*childproc.Process, log *slog.Logger) error {
	if led.ContainerdConfig == "" {
		return nil
	}
	if _, err := os.Stat(led.ContainerdConfig); err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if p, ok := live["containerd"]; ok {
		select {
		case <-p.Exited():
		default:
			return removeAllPods(ctx, led.Containerd)
		}
	}
	log.Info("starting containerd to remove the pods it left")
	p, err := childproc.Start("containerd-cleanup", filepath.Join(lay.Logs, "containerd-cleanup.log"), "containerd", "--config="+led.ContainerdConfig, "--log-level=warn")
	if err != nil {
		return err
	}
	defer p.Stop(10 * time.Second)
	for {
		if err := criReady(ctx, led.Containerd); err == nil {
			break
		}
		select {
		case <-p.Exited():
			return p.ExitErr()
		case <-ctx.Done():
			return fmt.Errorf("wait for containerd: %w", context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return removeAllPods(ctx, led.Containerd)
}

// killShims ends containerd shims still serving the node's containerd
// (after containerd stopped, normally none): they are the processes whose
// command line names its socket address.
func killShims(address string) error {
	if address == "" {
		return nil
	}
	var errs []error
	for _, pid := range pidsMatching(func(args []string) bool {
		return len(args) > 0 && strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") && hasArg(args, "-address", address)
	}) {
		errs = append(errs, procRecord{PID: pid, Start: startTime(pid)}.kill(5*time.Second))
	}
	return errors.Join(errs...)
}

// killPodProcesses ends processes still inside the kubepods cgroups the
// node created (a pod whose shim died): only the node's pods live there.
func killPodProcesses(absent []string) error {
	var errs []error
	for _, dir := range absent {
		if !within(dir, "/sys/fs/cgroup") {
			continue
		}
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					errs = append(errs, procRecord{PID: pid, Start: startTime(pid)}.kill(2*time.Second))
				}
			}
			return nil
		})
	}
	return errors.Join(errs...)
}

// pidsMatching returns the PIDs whose command line satisfies match.
func pidsMatching(match func(args []string) bool) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		if match(strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// hasArg reports whether args hold flag followed by value, or flag=value.
func hasArg(args []string, flag, value string) bool {
	for i, a := range args {
		if a == flag+"="+value || (a == flag && i+1 < len(args) && args[i+1] == value) {
			return true
		}
	}
	return false
}
