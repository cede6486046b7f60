package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/agent/cniconf"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
	"github.com/sockmesh/sockmesh/ctl/agentclient"
	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/datapath/bpffs"
)

func newUninstallCommand() *cobra.Command {
	var dir, socket, cniConfDir, cniBinDir string
	var force bool
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "detach sockmesh's eBPF programs and remove its pinned programs, links and maps",
		Long: `uninstall stops capture on this node at once: it detaches the pinned links
and removes <bpffs>/sockmesh. A stopped agent leaves them in place on
purpose, so that capture survives restarts and upgrades; run this after
removing the agent for good. Nothing pinned is not an error.

With --cni-conf-dir it first unchains sockmesh-cni from the node's CNI
configuration and removes its binary from --cni-bin-dir: an agent stopped
leaves them, so that pods wait for the next agent rather than start
uncaptured, and without an agent no pod outside the plugin's exempt
namespaces can start on the node until they are gone.

While an agent that answers on --introspection-socket runs on that pinned
state, uninstall refuses: it would stop the agent's capture under it (the
agent stays unready until restarted, and connections to Services whose
backends expect TLS go out in plaintext). --force uninstalls anyway, for
an agent that is hung or will not stop.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pinDir := filepath.Join(dir, "sockmesh")
			if !force {
				if err := checkNoAgent(cmd.Context(), socket, pinDir); err != nil {
					return err
				}
			}
			if cniConfDir != "" {
				if err := cniconf.Uninstall(cniConfDir, cniBinDir); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "unchained sockmesh-cni from %s\n", cniConfDir)
			}
			if err := datapath.Uninstall(datapath.Config{BPFFS: dir}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed sockmesh's pinned state from %s\n", pinDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "bpffs", bpffs.DefaultPath, "BPF filesystem the agent pinned its state in (its --bpffs)")
	cmd.Flags().StringVar(&socket, "introspection-socket", httpapi.DefaultSocket, "the agent's --introspection-socket, asked whether an agent runs on the pinned state")
	cmd.Flags().StringVar(&cniConfDir, "cni-conf-dir", "", "the node's CNI conf directory the agent chained sockmesh-cni in (its --cni-conf-dir; empty: leave CNI alone)")
	cmd.Flags().StringVar(&cniBinDir, "cni-bin-dir", "/opt/cni/bin", "the node's CNI bin directory holding sockmesh-cni (the agent's --cni-bin-dir)")
	cmd.Flags().BoolVar(&force, "force", false, "uninstall even while an agent runs on the pinned state (its capture stops under it)")
	return cmd
}

// checkNoAgent fails when an agent answers on socket and runs on the
// datapath pinned in pinDir, or when it cannot tell. An agent on another
// pin directory (another --bpffs) is left alone, and so is a socket no
// agent listens on (a stopped agent's).
func checkNoAgent(ctx context.Context, socket, pinDir string) error {
	c, err := agentclient.New(agentclient.Config{Socket: socket, Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	st, err := c.Status(ctx)
	switch {
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ECONNREFUSED):
		return nil
	case err != nil:
		return fmt.Errorf("cannot tell whether an agent runs on %s (pass --force to uninstall anyway): %w", pinDir, err)
	}
	// An empty PinDir: the agent could not read its datapath's state, which
	// may well be this one.
	if p := st.Datapath.State.PinDir; p != "" && filepath.Clean(p) != filepath.Clean(pinDir) {
		return nil
	}
	return fmt.Errorf("the agent on %s (node %q, version %s) runs on %s: stop it first (delete the DaemonSet and wait for its pods to end), or pass --force to stop its capture under it",
		socket, st.Node, st.Version, pinDir)
}

func newMountBPFFSCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "mount-bpffs",
		Short: "mount a BPF filesystem at --path unless one is there, and make it shared",
		Long: `mount-bpffs is the DaemonSet's privileged init container: pins must live on
the host's BPF filesystem to outlive the agent's pod. When --path is not on a
BPF filesystem it mounts one there and makes the mount shared, so that it
propagates to the host through a Bidirectional volume and from there to the
agent's container. A BPF filesystem already there is left as it is.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mounted, err := bpffs.IsMounted(dir)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			if mounted {
				fmt.Fprintf(cmd.OutOrStdout(), "a BPF filesystem is already mounted at %s\n", dir)
				return nil
			}
			if err := bpffs.Ensure(dir); err != nil {
				return err
			}
			if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
				return fmt.Errorf("make %s a shared mount: %w", dir, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "mounted a shared BPF filesystem at %s\n", dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "path", bpffs.DefaultPath, "where the BPF filesystem must be")
	return cmd
}
