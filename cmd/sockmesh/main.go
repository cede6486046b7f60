// Command sockmesh is the node agent and its maintenance commands:
//
//	sockmesh agent        run the agent: eBPF capture, the proxy, the control plane
//	sockmesh uninstall    detach and remove the pinned programs, links and maps
//	sockmesh mount-bpffs  mount a shared BPF filesystem (the DaemonSet's init container)
//	sockmesh probe        check that this container's agent serves (the DaemonSet's startup probe)
//	sockmesh version      print the build version
//
// See `sockmesh agent --help` for the agent's flags, logs and signals.
package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/spf13/cobra"
	// Backends validated against "System" roots need a trust store, and the
	// image ships none (one layer, static binaries): Mozilla's root list is
	// the fallback when the container has no store of its own
	// (docs/policies.md says how to use the node's instead).
	_ "golang.org/x/crypto/x509roots/fallback"

	"github.com/sockmesh/sockmesh/internal/buildversion"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	if err := newRootCommand(os.Getenv).Execute(); err != nil {
		// cobra printed the error.
		os.Exit(1)
	}
}

func newRootCommand(getenv func(string) string) *cobra.Command {
	root := &cobra.Command{
		Use:           "sockmesh",
		Short:         "sockmesh: an eBPF-accelerated, node-local, sidecarless mesh agent",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.AddCommand(newAgentCommand(getenv), newUninstallCommand(), newMountBPFFSCommand(), newProbeCommand(), newVersionCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the build version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "sockmesh %s (%s, %s/%s)\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
		},
	}
}

// buildVersion is version, or the module version when the binary was built
// with `go install module@version` and no -X.
func buildVersion() string { return buildversion.Of(version) }
