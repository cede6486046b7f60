package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"
)

const probeLong = `probe exits 0 when the agent of the container it runs in answers /healthz
on --addr; it is the DaemonSet's startup probe, which the kubelet runs in
the agent's container.

An HTTP probe cannot tell the agents of a rolling update apart: both listen
on the node's health port (SO_REUSEPORT), and until the new agent has bound
and taken it over — its process's start alone takes a few hundred
milliseconds — the old agent answers there. The kubelet then took the new
pod for started and ready, and the DaemonSet stopped the old agent while
the new one did not serve yet: connections to fail-closed Services were
refused until it did. Each agent names its container in its health answers
(the ` + containerHeader + ` header: its mount namespace, which a process the
kubelet runs in the container shares), and probe fails on an answer that
names another.`

// containerHeader names, in the agent's health answers, the container the
// agent runs in (containerID).
const containerHeader = "Sockmesh-Container"

func newProbeCommand() *cobra.Command {
	var (
		addr    string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "check that this container's agent answers on its health address (the startup probe)",
		Long:  probeLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return probe(ctx, addr)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:15021", "host:port reaching the agent's --health-listen")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for the answer (keep it below the probe's timeoutSeconds)")
	return cmd
}

// probe returns nil when GET /healthz at addr answers 200 from an agent of
// this process's container.
func probe(ctx context.Context, addr string) error {
	self, err := containerID()
	if err != nil {
		return err
	}
	got, err := askHealth(ctx, addr, "/healthz")
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	if got != self {
		return fmt.Errorf("probe %s: answered by the agent of another container (%s %q, this one's %q): this container's agent does not serve there yet",
			addr, containerHeader, got, self)
	}
	return nil
}

// askHealth returns the container named in a 200 answer to GET path at
// addr, the health address of the agents on this node; an answer of
// another status is an error.
func askHealth(ctx context.Context, addr, path string) (container string, _ error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return "", err
	}
	// A new connection each time: a kept one stays with the agent that
	// accepted it, however many took the address since.
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", path, resp.Status)
	}
	return resp.Header.Get(containerHeader), nil
}

// containerID names the container this process runs in: its mount
// namespace, as /proc/self/ns/mnt reads ("mnt:[4026532301]"). Every
// container has its own, and a process the runtime execs in a container
// (a probe) joins it; the agent runs with the host's network and PID
// namespaces, which name no container.
func containerID() (string, error) {
	id, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return "", fmt.Errorf("read this process's mount namespace: %w", err)
	}
	return id, nil
}

// namingContainer adds containerHeader, naming id, to h's answers.
func namingContainer(id string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(containerHeader, id)
		h.ServeHTTP(w, r)
	})
}
