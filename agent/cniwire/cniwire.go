package cniwire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultSocket is where the agent serves the plugin, unless configured
// otherwise on both sides (the plugin's conflist entry, the agent's flag).
// Its directory is the handover's alone, root's only.
const DefaultSocket = "/run/sockmesh/cni/cni.sock"

// Pod is what the plugin hands over at CNI ADD, beside the descriptor of
// the pod's network namespace.
type Pod struct {
	// Namespace, Name and UID are the pod's (CNI_ARGS K8S_POD_NAMESPACE,
	// K8S_POD_NAME, K8S_POD_UID; UID may be empty with older runtimes).
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	// ContainerID is the sandbox's (CNI_CONTAINERID): logs, and the name
	// of the handover's record (Record).
	ContainerID string `json:"containerID,omitempty"`
	// NetNS is the path of the pod's network namespace (CNI_NETNS) on the
	// host, for logs: the agent uses the descriptor passed with it.
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

// reply is an Answer on the wire, or why there is none.
type reply struct {
	Answer
	Error string `json:"error,omitempty"`
}

// ErrUnreachable is wrapped by Add's error when no agent answers on the
// socket: none runs on the node (yet), or it is starting.
var ErrUnreachable = errors.New("no sockmesh agent serves the CNI socket")

// maxMessage bounds a handover and an answer.
const maxMessage = 64 << 10

// Add hands p and its network namespace netns over to the agent serving
// socket and returns its answer. It gives up when ctx ends. An error means
// the pod's namespace may not be enrolled: ErrUnreachable when no agent
// answered, else the agent's reason.
func Add(ctx context.Context, socket string, p Pod, netns *os.File) (Answer, error) {
	msg, err := json.Marshal(p)
	if err != nil {
		return Answer{}, fmt.Errorf("encode handover: %w", err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return Answer{}, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Now()) })
	defer stop()
	what := fmt.Sprintf("hand pod %s/%s over to the agent at %s", p.Namespace, p.Name, socket)
	if _, _, err := uc.WriteMsgUnix(msg, unix.UnixRights(int(netns.Fd())), nil); err != nil {
		return Answer{}, fmt.Errorf("%s: %w", what, err)
	}
	if err := uc.CloseWrite(); err != nil {
		return Answer{}, fmt.Errorf("%s: %w", what, err)
	}
	data, err := io.ReadAll(io.LimitReader(uc, maxMessage))
	if ctx.Err() != nil {
		err = context.Cause(ctx) // says more than the deadline the read met
	}
	if err != nil {
		return Answer{}, fmt.Errorf("%s: read the answer: %w", what, err)
	}
	var r reply
	if err := json.Unmarshal(data, &r); err != nil {
		return Answer{}, fmt.Errorf("%s: decode the answer %q: %w", what, data, err)
	}
	if r.Error != "" {
		return Answer{}, fmt.Errorf("the agent did not enrol pod %s/%s: %s", p.Namespace, p.Name, r.Error)
	}
	return r.Answer, nil
}

// Read reads one handover from c, the agent's side of a connection: the
// pod, and the namespace's descriptor that came with its first bytes.
func Read(c *net.UnixConn) (Pod, *os.File, error) {
	buf := make([]byte, maxMessage)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return Pod{}, nil, fmt.Errorf("read handover: %w", err)
	}
	fd := rights(oob[:oobn])
	rest, err := io.ReadAll(io.LimitReader(c, int64(len(buf)-n)))
	var p Pod
	if err == nil {
		err = json.Unmarshal(append(buf[:n], rest...), &p)
	}
	switch {
	case err == nil && (p.Namespace == "" || p.Name == ""):
		err = errors.New("a handover names the pod's namespace and name (are K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS?)")
	case err == nil && fd < 0:
		err = errors.New("no network namespace came with the handover")
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return Pod{}, nil, fmt.Errorf("read handover: %w", err)
	}
	return p, os.NewFile(uintptr(fd), p.NetNS), nil
}

// Reply writes the agent's answer to a handover on c: a, or why it has
// none (err).
func Reply(c net.Conn, a Answer, err error) error {
	r := reply{Answer: a}
	if err != nil {
		r = reply{Error: err.Error()}
	}
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode the answer: %w", err)
	}
	_, err = c.Write(data)
	return err
}

// rights returns the descriptor oob carries (-1: none), closing any more.
func rights(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1
	}
	fd := -1
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, f := range fds {
			if fd < 0 {
				fd = f
			} else {
				unix.Close(f)
			}
		}
	}
	return fd
}

// RecordDir is where the agent serving socket records the handovers it
// settled, one file a sandbox (Record): beside the socket, in the
// directory only root may enter.
func RecordDir(socket string) string {
	return filepath.Join(filepath.Dir(socket), "handovers")
}

// Record is the path of sandbox's handover record in dir. The agent writes
// it once it enrolled the pod, for the next agent (a rolling update, a
// restart) to hold the pod enrolled before the API server has its address;
// the plugin removes it at CNI DEL, when the sandbox goes. A sandbox ID
// that is no plain file name (the runtime's are hex) is an error.
func Record(dir, sandbox string) (string, error) {
	if sandbox == "" || strings.HasPrefix(sandbox, ".") || strings.ContainsAny(sandbox, "/\x00") {
		return "", fmt.Errorf("sandbox ID %q is no file name", sandbox)
	}
	return filepath.Join(dir, sandbox+".json"), nil
}
