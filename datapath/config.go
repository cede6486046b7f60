package datapath

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/sockmesh/sockmesh/datapath/bpffs"
	"github.com/sockmesh/sockmesh/datapath/cgroup2"
	"github.com/sockmesh/sockmesh/datapath/mark"
)

// Config says where the datapath lives and how it behaves. The zero value is
// the production default.
type Config struct {
	// BPFFS is a directory on a BPF filesystem; state is pinned in its
	// "sockmesh" subdirectory. Empty means /sys/fs/bpf, mounted when absent.
	BPFFS string
	// Cgroup is the cgroup v2 directory the programs attach to; they act on
	// every process below it. Empty means the root of the cgroup v2
	// hierarchy, found in /proc/self/mountinfo.
	Cgroup string
	// ProxyMark is the SO_MARK of the proxy's sockets, which connect never
	// redirects in the netns Open runs in (the agent's, which the proxy
	// dials from). Elsewhere the mark changes nothing: pods may set it
	// (package mark). Zero means mark.Proxy.
	ProxyMark uint32
	// HeartbeatMaxAge is how old the proxy's heartbeat may grow before
	// fail-open services stop being redirected. Zero means 5s.
	HeartbeatMaxAge time.Duration
	// Accelerate hands each message between the application's socket and
	// the proxy's accepted socket straight to the other's receive queue
	// (sockhash + sk_msg) instead of through two TCP stacks. Needs Linux
	// 6.10: Open returns a *KernelTooOldError on older kernels. Off by
	// default: that path has no receive window, so a socket turns back to
	// TCP after 256 KiB its peer has not answered, and a client that
	// pipelines requests without reading the answers can still queue more
	// in its own socket.
	Accelerate bool

	// kernelTypes stands in for the running kernel's BTF when not nil: tests
	// load as on an older kernel with it.
	kernelTypes *btf.Spec
	// servicesMaxEntries, when not 0, replaces the services map's capacity
	// (65,536): tests fill a small map.
	servicesMaxEntries uint32
}

// DefaultHeartbeatMaxAge is the HeartbeatMaxAge used when Config leaves it 0.
const DefaultHeartbeatMaxAge = 5 * time.Second

// pinDirName is the subdirectory of Config.BPFFS that holds our pins.
const pinDirName = "sockmesh"

// withDefaults fills the zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if c.BPFFS == "" {
		c.BPFFS = bpffs.DefaultPath
	}
	if c.Cgroup == "" {
		root, err := cgroup2.Root()
		if err != nil {
			return c, fmt.Errorf("find cgroup to attach to: %w", err)
		}
		c.Cgroup = root
	}
	if c.ProxyMark == 0 {
		c.ProxyMark = mark.Proxy
	}
	switch {
	case c.HeartbeatMaxAge == 0:
		c.HeartbeatMaxAge = DefaultHeartbeatMaxAge
	case c.HeartbeatMaxAge < 0:
		return c, fmt.Errorf("heartbeat max age %v is negative", c.HeartbeatMaxAge)
	}
	return c, nil
}

func (c Config) pinDir() string { return filepath.Join(c.BPFFS, pinDirName) }
