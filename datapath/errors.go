package datapath

import (
	"fmt"

	"github.com/cilium/ebpf"
)

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
