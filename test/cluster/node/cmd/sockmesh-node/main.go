// Command sockmesh-node runs the cluster tier's single-node Kubernetes
// (test/cluster/node) by hand, as root, from the module root:
//
//	go run ./test/cluster/node/cmd/sockmesh-node up [-image IMG.tar]...
//	    brings the node up, prints the admin kubeconfig path and keeps the
//	    node running until SIGINT or SIGTERM, then takes it down.
//	go run ./test/cluster/node/cmd/sockmesh-node down
//	    undoes what a crashed run left on this machine (make e2e-cluster-clean).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sockmesh/sockmesh/test/cluster/node"
)

type imageList []string

func (l *imageList) String() string     { return fmt.Sprint(*l) }
func (l *imageList) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sockmesh-node:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("sockmesh-node", flag.ExitOnError)
	dir := fs.String("dir", node.DefaultDir, "the node's work directory")
	var images imageList
	fs.Var(&images, "image", "docker-archive tarball to import before the kubelet starts (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: sockmesh-node up|down [flags]")
		fs.PrintDefaults()
	}
	if len(os.Args) < 2 {
		fs.Usage()
		os.Exit(2)
	}
	verb := os.Args[1]
	fs.Parse(os.Args[2:])
	cfg := node.Config{Dir: *dir, Images: images, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch verb {
	case "up":
		n, err := node.Up(ctx, cfg)
		if err != nil {
			return err
		}
		fmt.Printf("node %s is up at %s\nexport KUBECONFIG=%s\n", n.Name, n.IP, n.Kubeconfig)
		<-ctx.Done()
		return n.Down()
	case "down":
		err := node.Clean(ctx, cfg)
		if errors.Is(err, node.ErrMissing) {
			return nil
		}
		return err
	default:
		fs.Usage()
		os.Exit(2)
	}
	return nil
}
