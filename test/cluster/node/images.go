package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/sockmesh/sockmesh/daemonset/image"
)

// BuildImage compiles the main package pkg (an import path, e.g.
// github.com/sockmesh/sockmesh/cmd/sockmesh-echo) with BuildBinary and
// writes it to out as a one-layer image tagged tag, the binary at
// /<last element of pkg> and its entrypoint.
func BuildImage(ctx context.Context, pkg, tag, out string) error {
	bin := filepath.Join(filepath.Dir(out), "."+path.Base(pkg)+".bin")
	if err := BuildBinary(ctx, pkg, bin); err != nil {
		return err
	}
	defer os.Remove(bin)
	return image.Write(out, image.Spec{Tag: tag, Files: []image.File{{HostPath: bin, ImagePath: "/" + path.Base(pkg)}}})
}

// BuildBinary compiles the main package pkg as a static, stripped binary
// at out. The go command runs in the working directory, which must lie
// inside the module that holds pkg.
func BuildBinary(ctx context.Context, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	// Static: the images have no libc. Unless told otherwise, build with the
	// toolchain that built this program, which evidently handles the module
	// (a machine's default go may be older than go.mod asks for).
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if os.Getenv("GOTOOLCHAIN") == "" && strings.HasPrefix(runtime.Version(), "go1.") {
		cmd.Env = append(cmd.Env, "GOTOOLCHAIN="+runtime.Version())
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", pkg, err, stderr.Bytes())
	}
	return nil
}

// importImage loads a docker-archive tarball into containerd's k8s.io
// namespace, the one the CRI serves.
func importImage(ctx context.Context, socket, tarball string) error {
	out, err := exec.CommandContext(ctx, "ctr", "--address", socket, "--namespace", "k8s.io",
		"images", "import", tarball).CombinedOutput()
	if err != nil {
		return fmt.Errorf("import image %s: %w: %s", tarball, err, bytes.TrimSpace(out))
	}
	return nil
}
