package apiserver

import (
	"context"
	"sync"
	"syscall"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestFreeze: once Freeze returns, every thread of kube-apiserver has
// stopped, so that nothing a test sends after it is answered. kill(2)
// returns before, and a busy server's threads run on for a while.
func TestFreeze(t *testing.T) {
	env := Start(t)
	// Busy, as when the tests freeze it: its threads run when SIGSTOP comes.
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() {
		cancel() // the requests the frozen server holds
		wg.Wait()
	}()
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				env.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
			}
		})
	}
	// Some rounds: how long the threads run on after kill(2) varies.
	pid := env.apiserver.Cmd.Process.Pid
	for round := range 20 {
		env.Freeze(t)
		running, err := runningThreads(pid)
		if err != nil {
			t.Fatal(err)
		}
		if running != 0 {
			t.Fatalf("round %d: %d threads of kube-apiserver run after Freeze, want 0", round, running)
		}
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
}
