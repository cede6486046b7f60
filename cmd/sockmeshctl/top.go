package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sockmesh/sockmesh/ctl/agentclient"
	"github.com/sockmesh/sockmesh/ctl/render"
	"github.com/sockmesh/sockmesh/ctl/top"
)

func newTopCommand(g *globals) *cobra.Command {
	var (
		interval time.Duration
		count    int
	)
	cmd := &cobra.Command{
		Use:   "top",
		Short: "show requests and errors per Service and datapath decisions per second",
		Long: `top scrapes the node agent's metrics every --interval and shows, for each
captured Service the proxy answered HTTP requests for, requests, 5xx and
4xx answers per second; the datapath's decisions per second (redirected,
and each reason a connect was not); and the proxy's new, failed and open
connections. It refreshes until interrupted, through an agent's restart
(a failed scrape is a warning, tried again at the next refresh), or --count
times (a failed scrape then ends it, exit status 1). With -o yaml
each refresh is one YAML document (separated by ---), with -o json one
JSON object.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			// A zero interval would scrape the agent as fast as it answers;
			// a negative count would exit at once, successful and silent.
			if interval <= 0 {
				return fmt.Errorf("--interval %s: want a positive duration", interval)
			}
			if count < 0 {
				return fmt.Errorf("--count %d: want 0 (until interrupted) or more", count)
			}
			c, err := g.agentFor(cmd.Context(), "")
			if err != nil {
				return err
			}
			node := ""
			if st, err := c.Status(cmd.Context()); err == nil {
				node = st.Node
			}
			out := cmd.OutOrStdout()
			clear := false
			if file, ok := out.(*os.File); ok && count != 1 && f == render.Table {
				clear = term.IsTerminal(int(file.Fd()))
			}
			prev, err := sample(cmd.Context(), c)
			if err != nil {
				return err
			}
			for shown := 0; count == 0 || shown < count; {
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(interval):
				}
				cur, err := sample(cmd.Context(), c)
				switch {
				case cmd.Context().Err() != nil:
					return nil
				case err != nil && count > 0:
					return err
				case err != nil:
					// Until interrupted, top outlives an agent's restart: the
					// next agent's first scrape is compared with the last
					// one's (top.Compute tells the processes apart).
					fmt.Fprintf(cmd.ErrOrStderr(), "Warning: %v; trying again in %s\n", err, interval)
					continue
				}
				v := top.Compute(prev, cur)
				v.Node = node
				prev = cur
				if clear {
					io.WriteString(out, "\033[H\033[2J")
				}
				// Refreshes printed one after another would be one YAML
				// document with every key repeated.
				if f == render.YAML && shown > 0 {
					io.WriteString(out, "---\n")
				}
				if err := render.Print(out, f, v, func(w io.Writer) error { return render.Top(w, v) }); err != nil {
					return err
				}
				shown++
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "time between refreshes")
	cmd.Flags().IntVar(&count, "count", 0, "refresh this many times, then exit (0: until interrupted)")
	return cmd
}

func sample(ctx context.Context, c *agentclient.Client) (top.Sample, error) {
	at := time.Now()
	mfs, err := c.Metrics(ctx)
	return top.Sample{Time: at, Families: mfs}, err
}
