package e2ecluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/sockmesh/sockmesh/daemonset/image"
	"github.com/sockmesh/sockmesh/internal/testenv"
	"github.com/sockmesh/sockmesh/test/cluster/node"
)

const (
	module        = "github.com/sockmesh/sockmesh"
	agentPackage  = module + "/cmd/sockmesh"
	pluginPackage = module + "/cmd/sockmesh-cni"
	agentImage    = "localhost/sockmesh:dev"
	echoImage     = "localhost/sockmesh-echo:dev"
	appImage      = "localhost/sockmesh-appclient:dev"
	appClientPort = 8080
)

// suite is what TestMain prepared for the tests. It is written once,
// before m.Run, and only read afterwards.
var suite struct {
	node *node.Node
	// skip or fail: why there is no node.
	skip, fail error
	// agentBin is the host copy of the agent binary (for `uninstall`).
	// Without it, agentAbsent (cmd/sockmesh does not exist yet: skip) or
	// agentErr (it does not build: fail) says why.
	agentBin    string
	agentAbsent error
	agentErr    error
	timings     []string
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if testing.Short() {
		suite.skip = errors.New("-short: the cluster tier takes a minute or more")
		return m.Run()
	}
	if os.Geteuid() != 0 {
		suite.skip = errors.New("needs root (a real kubelet, containerd, iptables)")
		return m.Run()
	}
	// The go commands the tests run (builds, go mod download) must use the
	// toolchain that built this test, which handles the module's go line.
	if os.Getenv("GOTOOLCHAIN") == "" {
		os.Setenv("GOTOOLCHAIN", runtime.Version())
	}
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	dir, err := os.MkdirTemp("", "sockmesh-e2ecluster-")
	if err != nil {
		suite.fail = err
		return m.Run()
	}
	defer os.RemoveAll(dir)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	images, err := buildImages(ctx, dir)
	if err != nil {
		suite.fail = err
		return m.Run()
	}
	timing("build images", start)

	start = time.Now()
	n, err := node.Up(ctx, node.Config{Images: images, Logger: log})
	switch {
	case errors.Is(err, node.ErrMissing):
		suite.skip = err
		return m.Run()
	case err != nil:
		suite.fail = err
		return m.Run()
	}
	timing("node up", start)
	suite.node = n

	code := m.Run()

	start = time.Now()
	if err := n.Down(); err != nil {
		fmt.Fprintf(os.Stderr, "e2ecluster: take the node down: %v\n", err)
		code = 1
	}
	timing("node down", start)
	if testing.Verbose() {
		for _, t := range suite.timings {
			fmt.Fprintln(os.Stderr, "e2ecluster timing:", t)
		}
	}
	return code
}

func timing(what string, start time.Time) {
	suite.timings = append(suite.timings, fmt.Sprintf("%s %.1fs", what, time.Since(start).Seconds()))
}

// buildImages builds the images the tests run, into dir. The agent's is
// left out (and suite.agentErr says why) while cmd/sockmesh does not exist
// or does not build: the machinery tests still run.
func buildImages(ctx context.Context, dir string) ([]string, error) {
	var images []string
	for _, img := range []struct{ pkg, tag string }{
		{module + "/cmd/sockmesh-echo", echoImage},
		{module + "/test/e2ecluster/appclient", appImage},
	} {
		out := filepath.Join(dir, filepath.Base(img.pkg)+".tar")
		if err := node.BuildImage(ctx, img.pkg, img.tag, out); err != nil {
			return nil, err
		}
		images = append(images, out)
	}
	// Tests run in their package directory.
	if _, err := os.Stat("../../cmd/sockmesh"); err != nil {
		suite.agentAbsent = fmt.Errorf("the agent (%s) does not exist yet: %w", agentPackage, err)
		return images, nil
	}
	// The same static binary goes into the image and runs `uninstall` on
	// the host; sockmesh-cni goes beside it, where the agent finds the
	// plugin it installs (daemonset/cni).
	bin, plugin := filepath.Join(dir, "sockmesh"), filepath.Join(dir, "sockmesh-cni")
	for _, b := range []struct{ pkg, out string }{{agentPackage, bin}, {pluginPackage, plugin}} {
		if err := node.BuildBinary(ctx, b.pkg, b.out); err != nil {
			suite.agentErr = err
			return images, nil
		}
	}
	out := filepath.Join(dir, "sockmesh.tar")
	if err := image.Write(out, image.Spec{Tag: agentImage, Files: []image.File{
		{HostPath: bin, ImagePath: "/sockmesh"},
		{HostPath: plugin, ImagePath: "/sockmesh-cni"},
	}}); err != nil {
		return nil, err
	}
	suite.agentBin = bin
	return append(images, out), nil
}

// cluster returns the node, or skips t (fails it in CI) when there is none.
func cluster(t *testing.T) *node.Node {
	t.Helper()
	testenv.RequireRoot(t)
	switch {
	case suite.fail != nil:
		t.Fatalf("cluster tier setup: %v", suite.fail)
	case testing.Short():
		t.Skip(suite.skip)
	case suite.skip != nil:
		testenv.SkipOrFail(t, "cluster tier: %v", suite.skip)
	}
	return suite.node
}

// requireAgentImage fails t when the agent image could not be built, and
// skips it (fails in CI) when there is no agent yet.
func requireAgentImage(t *testing.T) {
	t.Helper()
	switch {
	case suite.agentErr != nil:
		t.Fatalf("agent image: %v", suite.agentErr)
	case suite.agentAbsent != nil:
		testenv.SkipOrFail(t, "%v", suite.agentAbsent)
	}
}
