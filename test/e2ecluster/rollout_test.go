package e2ecluster

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockmesh/sockmesh/test/cluster/node"
)

// rolloutUnderTraffic runs change, a change of the agent's DaemonSet, while
// the app calls the TLS Service every 20 ms, each call a new connection.
// The rolling update starts the next agent beside the running one
// (maxSurge), which takes the proxy's addresses and the datapath over once
// ready; the old one then drains. Not one call may fail: refused, reset,
// 5xx or plaintext.
func rolloutUnderTraffic(t *testing.T, n *node.Node, w workloads, what string, change func()) {
	t.Helper()
	before := agentPods(t, n)
	var (
		mu       sync.Mutex
		calls    int
		failures []string
		stop     = make(chan struct{})
		done     = make(chan struct{})
	)
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond) // the traffic's pace, not a synchronisation
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			at := time.Now()
			res, err := call(context.Background(), w.app, Call{URL: fmt.Sprintf("http://%s/rollout/%d", w.tlsVIP, i), Mode: "http1"})
			if err == nil && res.Error != "" {
				err = fmt.Errorf("app: %s", res.Error)
			}
			if err == nil {
				err = tlsAnswer(res)
			}
			mu.Lock()
			calls++
			if err != nil {
				failures = append(failures, fmt.Sprintf("call at %s: %v", at.Format(time.StampMilli), err))
			}
			mu.Unlock()
		}
	}()
	finish := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}
	defer finish()

	// The most agent pods running at once, not terminating: two, if the
	// next agent really started beside the old one.
	var overlap atomic.Int32
	go func() {
		tick := time.NewTicker(100 * time.Millisecond) // sampling, not a synchronisation
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			list, err := n.Kube.CoreV1().Pods(agentNS).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				continue
			}
			running := int32(0)
			for _, p := range list.Items {
				if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
					running++
				}
			}
			if running > overlap.Load() {
				overlap.Store(running)
			}
		}
	}()

	start := time.Now()
	change()
	waitDaemonSetReady(t, n, agentNS, agentDS, 3*time.Minute)
	// Until the old agent has drained and exited: its listener closing is
	// part of what must lose nothing.
	waitFor(t, time.Minute, "the old agent pods gone", func(ctx context.Context) error {
		for _, name := range before {
			_, err := n.Kube.CoreV1().Pods(agentNS).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				return fmt.Errorf("%s still there", name)
			}
			if !errors.IsNotFound(err) {
				return err
			}
		}
		return nil
	}, nil)
	// Traffic on the new agent alone: calls made after the old ones left.
	mu.Lock()
	gone := calls
	mu.Unlock()
	waitFor(t, time.Minute, "calls to the new agent alone", func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if after := calls - gone; after < 20 {
			return fmt.Errorf("%d calls since the old agent pods left", after)
		}
		return nil
	}, nil)
	finish()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%s: %d calls in %s, %d failed; at most %d agent pods running at once", what, calls,
		time.Since(start).Round(time.Millisecond), len(failures), overlap.Load())
	if overlap.Load() < 2 {
		t.Errorf("%s: the next agent never ran beside the old one (at most %d running at once): the DaemonSet did not surge", what, overlap.Load())
	}
	if len(failures) > 0 {
		t.Errorf("%s: %d of %d calls failed, first ones:\n%s\n%s", what, len(failures), calls,
			strings.Join(failures[:min(len(failures), 5)], "\n"), agentLogs(n))
	}
}

// tlsAnswer checks that the backend answered 200 in TLS.
func tlsAnswer(res Result) error {
	rep, err := res.Report()
	switch {
	case err != nil:
		return err
	case res.Status != http.StatusOK:
		return fmt.Errorf("status %d", res.Status)
	}
	return wantTLS(rep)
}

// agentPods names the agent's pods.
func agentPods(t *testing.T, n *node.Node) []string {
	t.Helper()
	list, err := n.Kube.CoreV1().Pods(agentNS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list.Items {
		names = append(names, p.Name)
	}
	return names
}
