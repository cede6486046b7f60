package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/sockmesh/sockmesh/agent/cniwire"
)

// defaultTimeout is how long ADD waits for the agent by default: above the
// agent's own bound (cnihandover.DefaultTimeout), far below the kubelet's
// for making a sandbox (its runtime request timeout, 2 minutes).
const defaultTimeout = 10 * time.Second

// conf is the plugin's configuration, as the runtime hands it on stdin.
type conf struct {
	Socket           string   `json:"socket"`
	Timeout          string   `json:"timeout"`
	ExemptNamespaces []string `json:"exemptNamespaces"`
	// PrevResult is the plugins' before this one, passed on untouched.
	PrevResult json.RawMessage `json:"prevResult"`
}

func parseConf(stdin []byte) (conf, time.Duration, error) {
	var c conf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return conf{}, 0, fmt.Errorf("parse the sockmesh-cni configuration: %w", err)
	}
	if c.Socket == "" {
		c.Socket = cniwire.DefaultSocket
	}
	timeout := defaultTimeout
	if c.Timeout != "" {
		d, err := time.ParseDuration(c.Timeout)
		if err != nil || d <= 0 {
			return conf{}, 0, fmt.Errorf("sockmesh-cni configuration: timeout %q is no positive duration", c.Timeout)
		}
		timeout = d
	}
	if len(c.PrevResult) == 0 || string(c.PrevResult) == "null" {
		return conf{}, 0, errors.New("sockmesh-cni has no previous result: it must be chained after the plugin that sets the pod's network up")
	}
	return c, timeout, nil
}

func cmdAdd(args *skel.CmdArgs) error { return add(args, os.Stdout, os.Stderr) }

// add hands the pod over and, once the agent enrolled it or said it is not
// captured, writes the previous result to stdout.
func add(args *skel.CmdArgs, stdout, stderr io.Writer) error {
	c, timeout, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	k8s := cniArgs(args.Args)
	if k8s["K8S_POD_NAME"] != "" {
		p := cniwire.Pod{
			Namespace: k8s["K8S_POD_NAMESPACE"], Name: k8s["K8S_POD_NAME"], UID: k8s["K8S_POD_UID"],
			ContainerID: args.ContainerID, NetNS: args.Netns,
		}
		if p.IPs, err = resultIPs(c.PrevResult); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := handOver(ctx, c.Socket, p); err != nil {
			if !slices.Contains(c.ExemptNamespaces, p.Namespace) {
				return err
			}
			// The runtime logs a plugin's stderr.
			fmt.Fprintf(stderr, "sockmesh-cni: pod %s/%s starts uncaptured, its namespace is exempt: %v\n", p.Namespace, p.Name, err)
		}
	}
	// Not a Kubernetes pod (no K8S_POD_NAME): nothing to hand over.
	_, err = stdout.Write(c.PrevResult)
	return err
}

// handOver passes the pod's network namespace to the agent, by
// descriptor: the agent's container does not see the runtime's netns
// mounts.
func handOver(ctx context.Context, socket string, p cniwire.Pod) error {
	netns, err := os.Open(p.NetNS)
	if err != nil {
		return fmt.Errorf("open the pod's network namespace: %w", err)
	}
	defer netns.Close()
	_, err = cniwire.Add(ctx, socket, p, netns)
	return err
}

// cmdDel removes the sandbox's handover record, if the agent wrote one
// (cniwire.Record): the next agent must not look for its pod there. The
// agent releases the pod's namespace itself, when its Snapshot no longer
// lists the pod or lists it with another sandbox's address. DEL fails for
// nothing: the kubelet retries a failed one before it lets the pod go.
func cmdDel(args *skel.CmdArgs) error {
	var c conf
	if json.Unmarshal(args.StdinData, &c) != nil || c.Socket == "" {
		c.Socket = cniwire.DefaultSocket
	}
	path, err := cniwire.Record(cniwire.RecordDir(c.Socket), args.ContainerID)
	if err == nil {
		err = os.Remove(path)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "sockmesh-cni: sandbox %s: %v\n", args.ContainerID, err) // the runtime logs it
	}
	return nil
}

// cmdCheck checks the configuration only: whether the pod's namespace is
// enrolled, the agent's status (sockmeshctl status) tells.
func cmdCheck(args *skel.CmdArgs) error {
	_, _, err := parseConf(args.StdinData)
	return err
}

// cniArgs parses CNI_ARGS, "K1=V1;K2=V2".
func cniArgs(s string) map[string]string {
	out := map[string]string{}
	for kv := range strings.SplitSeq(s, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}

// resultIPs reads the addresses of a CNI result (0.3.0 and later: ips[].address, a CIDR).
func resultIPs(raw json.RawMessage) ([]netip.Addr, error) {
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("parse the previous result: %w", err)
	}
	var out []netip.Addr
	for _, ip := range r.IPs {
		p, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			return nil, fmt.Errorf("previous result: address %q: %w", ip.Address, err)
		}
		out = append(out, p.Addr().Unmap())
	}
	return out, nil
}
