package cnihandover

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// DefaultSocket is where the agent serves the plugin, unless configured
// otherwise on both sides (the plugin's conflist entry, the agent's flag).
const DefaultSocket = "/var/run/sockmesh/cni.sock"

// Pod is what the plugin hands over at CNI ADD.
type Pod struct {
	// Namespace, Name and UID are the pod's (CNI_ARGS K8S_POD_NAMESPACE,
	// K8S_POD_NAME, K8S_POD_UID; UID may be empty with older runtimes).
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	// ContainerID is the sandbox's (CNI_CONTAINERID), for logs.
	ContainerID string `json:"containerID,omitempty"`
	// NetNS is the path of the pod's network namespace (CNI_NETNS).
	NetNS string `json:"netns"`
	// IPs are the addresses the plugins before sockmesh's gave the pod
	// (their result's ips).
	IPs []netip.Addr `json:"ips"`
}

// Answer is the agent's answer to a handover it could settle.
type Answer struct {
	// Captured is set when the pod's namespace is enrolled.
	Captured bool `json:"captured"`
	// Reason says why the pod is not captured (an opt-out label, ...).
	Reason string `json:"reason,omitempty"`
}

// ErrUnreachable is wrapped by Add's error when no agent answers on the
// socket: none runs on the node (yet), or it is starting.
var ErrUnreachable = errors.New("no sockmesh agent serves the CNI socket")

// addPath is the one request's path.
const addPath = "/v1/add"

// Add hands p over to the agent serving socket and returns its answer. It
// gives up when ctx ends. An error means the pod's namespace may not be
// enrolled: ErrUnreachable when no agent answered, else the agent's reason.
func Add(ctx context.Context, socket string, p Pod) (Answer, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return Answer{}, fmt.Errorf("encode handover: %w", err)
	}
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", socket)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
			}
			return c, nil
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://sockmesh"+addPath, bytes.NewReader(body))
	if err != nil {
		return Answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return Answer{}, fmt.Errorf("hand pod %s/%s over to the agent at %s: %w", p.Namespace, p.Name, socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Answer{}, fmt.Errorf("read the agent's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return Answer{}, fmt.Errorf("the agent did not enrol pod %s/%s: %s", p.Namespace, p.Name, strings.TrimSpace(string(data)))
	}
	var a Answer
	if err := json.Unmarshal(data, &a); err != nil {
		return Answer{}, fmt.Errorf("decode the agent's answer: %w", err)
	}
	return a, nil
}

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
