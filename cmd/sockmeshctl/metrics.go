package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/sockmesh/sockmesh/ctl/render"
)

func newMetricsCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "metrics",
		Short: "list every metric the node agent registered, with its type, labels and help",
		Long: `metrics lists the agent's metric catalog: every metric registered, also
those without a series yet, as docs/metrics.md documents them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			c, err := g.agentFor(cmd.Context(), "")
			if err != nil {
				return err
			}
			infos, err := c.Catalog(cmd.Context())
			if err != nil {
				return err
			}
			return render.Print(cmd.OutOrStdout(), f, infos, func(w io.Writer) error { return render.Metrics(w, infos) })
		},
	}
}
