package main

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/sockmesh/sockmesh/datapath"
	"github.com/sockmesh/sockmesh/datapath/bpffs"
)

func newUninstallCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "detach sockmesh's eBPF programs and remove its pinned programs, links and maps",
		Long: `uninstall stops capture on this node at once: it detaches the pinned links
(even while an agent still holds them) and removes <bpffs>/sockmesh. A
stopped agent leaves them in place on purpose, so that capture survives
restarts and upgrades; run this after removing the agent for good. Nothing
pinned is not an error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := datapath.Uninstall(datapath.Config{BPFFS: dir}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed sockmesh's pinned state from %s\n", filepath.Join(dir, "sockmesh"))
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "bpffs", bpffs.DefaultPath, "BPF filesystem the agent pinned its state in (its --bpffs)")
	return cmd
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
