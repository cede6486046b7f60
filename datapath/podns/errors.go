package podns

import "errors"

var (
	// ErrNotFound: no network namespace on this node holds the address.
	ErrNotFound = errors.New("no network namespace holds the address")
	// ErrAmbiguous: several network namespaces hold the address (loopback
	// addresses, or a misconfigured node).
	ErrAmbiguous = errors.New("several network namespaces hold the address")
)
