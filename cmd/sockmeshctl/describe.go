package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sockmesh/sockmesh/ctl/describe"
	"github.com/sockmesh/sockmesh/ctl/render"
)

const describeLong = `describe shows the effective backend properties of an object, computed
from the API server's objects by the same translate code the agents run:

  service NAME            each port: captured or not, failure policy, the
                          backend (protocol, wire, TLS, trust, endpoints, why
                          it fails closed), routes; and every policy, XBackend
                          and route naming it, with its status
  backendtlspolicy NAME   its status per target (which policy won a conflict
                          and why) and the targets' effective properties
  xbackend NAME           its status and the backend it makes
  httproute NAME          its status per parent and where its rules landed
  grpcroute NAME          the same for a GRPCRoute

Status is what translate computes now, which the elected agent writes to
the cluster.`

func newDescribeCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:       "describe service|backendtlspolicy|xbackend|httproute|grpcroute NAME",
		Short:     "show the effective backend properties of a Service, BackendTLSPolicy, XBackend, HTTPRoute or GRPCRoute",
		Long:      describeLong,
		Example:   "  sockmeshctl describe service -n app secure\n  sockmeshctl describe backendtlspolicy app/secure -o yaml",
		Args:      cobra.ExactArgs(2),
		ValidArgs: []string{"service", "backendtlspolicy", "xbackend", "httproute", "grpcroute"},
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := g.format()
			if err != nil {
				return err
			}
			kind := strings.ToLower(args[0])
			if k, ok := kindAliases[kind]; ok {
				kind = k
			}
			if _, ok := describeKinds[kind]; !ok {
				return fmt.Errorf("unknown kind %q: want service, backendtlspolicy, xbackend, httproute or grpcroute", args[0])
			}
			kube, gw, err := g.kube()
			if err != nil {
				return err
			}
			ref, err := parseRef(args[1], g.ns())
			if err != nil {
				return fmt.Errorf("%s %w", kind, err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*g.timeout)
			defer cancel()
			in, warnings, err := describe.Load(ctx, kube, gw, time.Now(), ref.Namespace)
			if err != nil {
				return err
			}
			c, err := describe.New(in, warnings)
			if err != nil {
				return err
			}
			data, table, err := describeKinds[kind](c, ref.Namespace, ref.Name)
			if errors.Is(err, describe.ErrNotFound) && len(warnings) > 0 {
				// Not found among what could be read is no proof it is not there.
				for _, w := range warnings {
					fmt.Fprintf(cmd.ErrOrStderr(), "Warning: %s\n", w)
				}
				return fmt.Errorf("%w among the objects that could be read (warnings above)", err)
			}
			if err != nil {
				return err
			}
			return render.Print(cmd.OutOrStdout(), f, data, table)
		},
	}
}

// kindAliases are the other names kubectl users type.
var kindAliases = map[string]string{
	"svc": "service", "services": "service",
	"backendtlspolicies": "backendtlspolicy", "btlspolicy": "backendtlspolicy",
	"xbackends": "xbackend", "httproutes": "httproute", "grpcroutes": "grpcroute",
}

// describeKinds describe one kind: the data and its table.
var describeKinds = map[string]func(c *describe.Cluster, ns, name string) (any, func(io.Writer) error, error){
	"service": func(c *describe.Cluster, ns, name string) (any, func(io.Writer) error, error) {
		v, err := c.Service(ns, name)
		return v, func(w io.Writer) error { return render.Service(w, v) }, err
	},
	"backendtlspolicy": func(c *describe.Cluster, ns, name string) (any, func(io.Writer) error, error) {
		v, err := c.BackendTLSPolicy(ns, name)
		return v, func(w io.Writer) error { return render.Policy(w, v) }, err
	},
	"xbackend": func(c *describe.Cluster, ns, name string) (any, func(io.Writer) error, error) {
		v, err := c.XBackend(ns, name)
		return v, func(w io.Writer) error { return render.XBackend(w, v) }, err
	},
	"httproute": func(c *describe.Cluster, ns, name string) (any, func(io.Writer) error, error) {
		v, err := c.HTTPRoute(ns, name)
		return v, func(w io.Writer) error { return render.Route(w, v) }, err
	},
	"grpcroute": func(c *describe.Cluster, ns, name string) (any, func(io.Writer) error, error) {
		v, err := c.GRPCRoute(ns, name)
		return v, func(w io.Writer) error { return render.Route(w, v) }, err
	},
}
