package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// ErrOwnerCheck is wrapped by Heartbeat's error when the heartbeat was
// written but noticing that a newer agent took the datapath over, or
// taking it back from one that exited, failed: fail-open services still
// see a live proxy, and the next Heartbeat tries again.
var ErrOwnerCheck = errors.New("check the datapath's owner")

// ErrServicesLeftOut is wrapped by SetServices' (and Apply's) error when
// the services map could not hold every Service: it holds the others, each
// whole, and nothing else, and the error names those left out, none of
// whose addresses is captured.
var ErrServicesLeftOut = errors.New("services left out")

// KernelTooOldError is returned by Open when Config asks for something the
// running kernel lacks. It matches ebpf.ErrNotSupported with errors.Is.
type KernelTooOldError struct {
	Feature string // what Config asked for
	Kernel  string // the first Linux version that has it, e.g. "6.10"
	Missing string // what this kernel lacks, as its BTF shows
}

func (e *KernelTooOldError) Error() string {
	return fmt.Sprintf("%s needs Linux %s or later: this kernel has no %s", e.Feature, e.Kernel, e.Missing)
}

// Is reports ebpf.ErrNotSupported, as cilium/ebpf's own feature errors do.
func (e *KernelTooOldError) Is(target error) bool { return target == ebpf.ErrNotSupported }
