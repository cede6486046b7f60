package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ledger records every change a node makes to the host, each written down
// before it is made, so that Down — in this process or, after a crash, in
// the next — undoes exactly those changes and nothing else.
type ledger struct {
	path string

	// Owner is the PID of the process that brought the node up.
	Owner int `json:"owner"`
	// Procs are the components started, by name.
	Procs map[string]procRecord `json:"procs,omitempty"`
	// Containerd is the address of the node's private containerd; its
	// shims carry it on their command line.
	Containerd string `json:"containerd,omitempty"`
	// ContainerdConfig is containerd's config file, kept so that a later
	// run can start the same containerd to remove what it left.
	ContainerdConfig string `json:"containerdConfig,omitempty"`
	// Sysctls holds, for each sysctl (a path under /proc/sys) the node's
	// components may change, its value before bring-up.
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// Absent lists host paths that did not exist before bring-up and that
	// components hard-code (no flag moves them into Dir).
	Absent []string `json:"absent,omitempty"`
	// Netns lists the entries of /run/netns before bring-up; NetnsDir
	// reports whether /run/netns existed.
	Netns    []string `json:"netns,omitempty"`
	NetnsDir bool     `json:"netnsDir,omitempty"`
	// LoAddr is the node address put on lo ("" if none yet).
	LoAddr string `json:"loAddr,omitempty"`
	// Bridge is the CNI bridge's name.
	Bridge string `json:"bridge,omitempty"`
	// CNINetwork is the CNI network name (its results are cached under it).
	CNINetwork string `json:"cniNetwork,omitempty"`
	// BPFFSMountID is the mount ID of the bpffs the node mounted at
	// /sys/fs/bpf (0: it mounted none).
	BPFFSMountID int `json:"bpffsMountID,omitempty"`
	// BPFFSShared reports that the node made an existing /sys/fs/bpf mount
	// shared (Down makes it private again).
	BPFFSShared bool `json:"bpffsShared,omitempty"`
	// IPTables reports that components may have written iptables rules.
	IPTables bool `json:"iptables,omitempty"`
	// NFTTables lists the nftables tables before bring-up, when NFTKnown
	// (the nft program exists). iptables-nft creates tables on first use.
	NFTTables []string `json:"nftTables,omitempty"`
	NFTKnown  bool     `json:"nftKnown,omitempty"`
}

// save writes the ledger atomically.
func (l *ledger) save() error {
	data, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return fmt.Errorf("encode ledger: %w", err)
	}
	tmp := l.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	return nil
}

// loadLedger reads the ledger at path; ok is false when there is none.
func loadLedger(path string) (l *ledger, ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read ledger: %w", err)
	}
	l = &ledger{path: path}
	if err := json.Unmarshal(data, l); err != nil {
		return nil, false, fmt.Errorf("decode ledger %s: %w", path, err)
	}
	return l, true, nil
}

// lockFile is an exclusive flock on a file next to the node's directory.
type lockFile struct {
	f *os.File
}

// acquireLock takes the lock at path, waiting until ctx ends. The file is
// removed on release; a waiter that then holds a lock on the removed file
// notices (the path names another inode or none) and tries again.
func acquireLock(ctx context.Context, path string) (*lockFile, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create lock dir: %w", err)
	}
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open lock %s: %w", path, err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			var held, named syscall.Stat_t
			if syscall.Fstat(int(f.Fd()), &held) == nil && syscall.Stat(path, &named) == nil && held.Ino == named.Ino {
				return &lockFile{f: f}, nil
			}
		}
		f.Close()
		if err != nil && !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for lock %s (another node runs on this machine): %w", path, context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// release removes the lock file and unlocks it.
func (l *lockFile) release() {
	os.Remove(l.f.Name())
	l.f.Close()
}
