package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/internal/sandbox"
	"github.com/sockmesh/sockmesh/internal/testenv"
)

func TestMain(m *testing.M) {
	sandbox.Main(m, map[string]func([]string) error{"up-and-hang": upAndHang})
}

// upAndHang is the child of TestCrashRecovery: it brings a node up, runs a
// pod on it, says "ready" and waits to be killed.
func upAndHang([]string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	n, err := Up(ctx, Config{})
	if err != nil {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "survivor", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "pause", Image: PauseImage, ImagePullPolicy: corev1.PullNever,
		}}},
	}
	if _, err := n.Kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	for {
		p, err := n.Kube.CoreV1().Pods("default").Get(ctx, "survivor", metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod never ran: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	fmt.Println("ready")
	<-ctx.Done()
	return nil
}

// TestCrashRecovery kills a process holding a running node with a running
// pod (SIGKILL: no Down, containerd's shims and the pod outlive it), then
// checks that Clean finds what it left and restores the machine exactly.
func TestCrashRecovery(t *testing.T) {
	before := hostBefore(t, "brings a node up")
	ctx := t.Context()

	cmd := sandbox.HelperCommand(t, "up-and-hang")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	p := sandbox.Start(t, cmd, nil, nil)
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("child said %q", line)
		}
		ready <- err
		io.Copy(io.Discard, stdout)
	}()
	select {
	case err := <-ready:
		if err != nil {
			p.Wait()
			t.Fatalf("child: %v\n%s", err, stderr.String())
		}
	case <-time.After(5 * time.Minute):
		t.Fatalf("child not ready:\n%s", stderr.String())
	}
	crashed, err := ReadHostState(ctx, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if crashed.Shims == 0 || !crashed.Bridge {
		t.Fatalf("the node was not up with a pod: %+v", crashed)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.Wait()
	// The shims and the pod survive their node's owner.
	if left, _ := ReadHostState(ctx, Config{}); left.Shims == 0 {
		t.Fatalf("no shim survived the kill: the test proves nothing")
	}

	if err := Clean(ctx, Config{}); err != nil {
		t.Fatalf("clean up after the crash: %v", err)
	}
	// Look under the lock: a node of another test (the cluster tier) may
	// start as soon as Clean lets go of it.
	lock, err := acquireLock(ctx, LockPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.release()
	after, err := ReadHostState(ctx, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if d := before.Diff(after); len(d) > 0 {
		t.Errorf("the machine differs after Clean:\n%s", strings.Join(d, "\n"))
	}
	if _, err := os.Stat(DefaultDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after Clean", DefaultDir)
	}
}

// TestUpFailsHalfWay makes bring-up fail after etcd, the API server and
// containerd run and the host is changed (an image that cannot be
// imported), and checks that Up undid it all.
func TestUpFailsHalfWay(t *testing.T) {
	before := hostBefore(t, "starts a control plane")
	ctx := t.Context()
	bogus := t.TempDir() + "/not-an-image.tar"
	os.WriteFile(bogus, []byte("not a tarball"), 0o600)
	n, err := Up(ctx, Config{Images: []string{bogus}})
	if err == nil {
		n.Down()
		t.Fatal("Up imported a bogus image")
	}
	if !strings.Contains(err.Error(), "import image") || strings.Contains(err.Error(), "differs") {
		t.Errorf("Up = %v, want an import error and nothing left behind", err)
	}
	after, err := ReadHostState(ctx, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if d := before.Diff(after); len(d) > 0 {
		t.Errorf("the machine differs after a failed Up:\n%s", strings.Join(d, "\n"))
	}
}

// hostBefore skips t under -short (what says why) or without the built
// binaries (failing in CI), then returns the machine's state without a
// node: another node may be up (the cluster tier), so it waits for the
// node lock first.
func hostBefore(t *testing.T, what string) HostState {
	t.Helper()
	testenv.RequireRoot(t)
	if testing.Short() {
		t.Skip("-short: " + what)
	}
	if _, err := (Config{}).withDefaults(); errors.Is(err, ErrMissing) {
		testenv.SkipOrFail(t, "%v", err)
	}
	lock, err := acquireLock(t.Context(), LockPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.release()
	before, err := ReadHostState(t.Context(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	return before
}
