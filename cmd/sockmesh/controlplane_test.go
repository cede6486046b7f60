package main

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// TestLeaderIdentity: two agents that overlap on a node (a rolling update)
// have different identities in the Lease, also without $POD_NAME, where both
// have the node's host name (hostNetwork); with one identity both would
// lead at once.
func TestLeaderIdentity(t *testing.T) {
	s := settings{nodeName: "node-1", podName: "sockmesh-abcde"}
	if got := leaderIdentity(s); got != "node-1/sockmesh-abcde" {
		t.Errorf("leaderIdentity with a pod name = %q, want node-1/sockmesh-abcde", got)
	}
	s.podName = ""
	a, b := leaderIdentity(s), leaderIdentity(s)
	if a == b || !strings.HasPrefix(a, "node-1/") {
		t.Errorf("leaderIdentity without a pod name = %q, then %q: want node-1/... and different", a, b)
	}
}

// TestLeaseClientTimesOut: a request of the elector's client to an API
// server that accepts the connection and never answers fails with a
// timeout, rather than waiting for ever (client-go sends the acquiring
// requests with no deadline).
func TestLeaseClientTimesOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		var held []net.Conn // open, never answered, until ln closes
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	kube, err := leaseClient(&rest.Config{Host: "http://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := kube.CoordinationV1().Leases("sockmesh-system").Get(context.Background(), "sockmesh-writer", metav1.GetOptions{})
		done <- err
	}()
	select {
	case err := <-done:
		var ne net.Error
		if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("Get from an API server that never answers: %v, want a timeout", err)
		}
	case <-time.After(waitFor):
		t.Fatalf("Get from an API server that never answers still waits after %s", waitFor)
	}
}
