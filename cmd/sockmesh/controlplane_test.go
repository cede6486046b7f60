package main

import (
	"strings"
	"testing"
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
