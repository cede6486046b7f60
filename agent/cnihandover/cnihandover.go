package cnihandover

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// Listen opens the agent's socket at path, in a directory only root may
// enter (made if missing). A socket left there by an agent that stopped is
// replaced; one an agent still serves too (a rolling update) is taken
// over: new handovers come here. Closing the listener leaves the socket
// file, which the next agent may serve already.
func Listen(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the CNI socket's directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("restrict the CNI socket's directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove the old CNI socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on the CNI socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	return ln, nil
}
