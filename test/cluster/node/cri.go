package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// removeAllPods stops and removes every pod sandbox containerd's CRI knows,
// through the CRI as the kubelet would: containerd then kills the
// containers, runs CNI DEL (the veth and the IP go), removes the sandbox's
// network namespace, mounts and cgroups. Stopping the kubelet leaves pods
// running; this is what ends them.
func removeAllPods(ctx context.Context, socket string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial cri %s: %w", socket, err)
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	list, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list pod sandboxes: %w", err)
	}
	var errs []error
	for _, sb := range list.Items {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stop pod sandbox %s (%s/%s): %w", sb.Id, sb.Metadata.GetNamespace(), sb.Metadata.GetName(), err))
			continue
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove pod sandbox %s (%s/%s): %w", sb.Id, sb.Metadata.GetNamespace(), sb.Metadata.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// criReady reports whether containerd's CRI answers.
func criReady(ctx context.Context, socket string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial cri %s: %w", socket, err)
	}
	defer conn.Close()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return fmt.Errorf("cri status: %w", err)
	}
	for _, c := range resp.GetStatus().GetConditions() {
		// NetworkReady turns true once the CNI config is loaded; the
		// kubelet keeps the node NotReady until then anyway.
		if c.Type == runtimeapi.RuntimeReady && !c.Status {
			return fmt.Errorf("cri runtime not ready: %s", c.Message)
		}
	}
	return nil
}

// CNIPlugins returns the types of the plugins containerd's CRI runs for a
// pod's network (the node's conflist as it last loaded it, not as the file
// reads now: it reloads on a change of the conf directory), in order. A
// test that chains a plugin waits here until sandboxes made next run it.
func (n *Node) CNIPlugins(ctx context.Context) ([]string, error) {
	conn, err := grpc.NewClient("unix://"+n.lay.ContainerdSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial cri %s: %w", n.lay.ContainerdSocket, err)
	}
	defer conn.Close()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("cri status: %w", err)
	}
	// containerd 1.6's verbose status: "cniconfig" is go-cni's ConfigResult.
	var conf struct {
		Networks []struct {
			Config struct {
				Name    string
				Plugins []struct {
					Network struct {
						Type string `json:"type"`
					}
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(resp.GetInfo()["cniconfig"]), &conf); err != nil {
		return nil, fmt.Errorf("parse containerd's cniconfig: %w", err)
	}
	for _, nw := range conf.Networks {
		if nw.Config.Name != n.lay.CNINetwork {
			continue // the loopback network containerd adds
		}
		var types []string
		for _, p := range nw.Config.Plugins {
			types = append(types, p.Network.Type)
		}
		return types, nil
	}
	return nil, fmt.Errorf("containerd has loaded no CNI network %s", n.lay.CNINetwork)
}
