// Command sockmeshctl shows what sockmesh does and why, without reading
// trace_pipe:
//
//	sockmeshctl explain POD DESTINATION:PORT   what happens to POD's connections, and why
//	sockmeshctl describe KIND NAME             the effective backend properties of an object
//	sockmeshctl status                         the node agent's programs, pins, snapshot, errors
//	sockmeshctl top                            requests, errors and datapath decisions per second
//	sockmeshctl metrics                        every metric the agent registered
//
// It reads objects from the API server (--kubeconfig, like kubectl) and
// asks the node's agent through its read-only introspection API: the unix
// socket /run/sockmesh/agent.sock on the node (root only), or an agent's
// --introspection-listen port over TLS with a bearer token (--agent-port or
// --agent-address, with --agent-token-file). Output is a table, or -o
// yaml|json.
package main

import (
	"os"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/sockmesh/sockmesh/internal/buildversion"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	if err := newRootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "sockmeshctl",
		Short:         "sockmeshctl explains what sockmesh does with a pod's connections, and why",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	g.addFlags(root.PersistentFlags())
	root.AddCommand(newExplainCommand(g), newDescribeCommand(g), newStatusCommand(g), newTopCommand(g),
		newMetricsCommand(g), newVersionCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the build version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			cmd.Printf("sockmeshctl %s (%s, %s/%s)\n", buildversion.Of(version), runtime.Version(), runtime.GOOS, runtime.GOARCH)
		},
	}
}
