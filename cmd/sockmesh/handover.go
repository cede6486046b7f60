package main

import (
	"context"
	"slices"
	"time"

	"github.com/sockmesh/sockmesh/datapath"
)

// Handover polling: how often the stopping agent asks, and how long one
// answer may take (a newer agent that accepts but does not answer yet is
// not ready).
const (
	handoverPoll    = 100 * time.Millisecond
	handoverTimeout = time.Second
)

// handOver keeps the agent serving after a stop signal until a newer agent
// on the node is ready, capture is removed from the node, or
// --handover-wait has passed; ctx ends it early (a part failed). A
// rolling update stops this agent once its successor is ready, so it
// returns at once; it waits where the signal came first: a deleted pod
// whose replacement is still starting, or a successor that crashes. Closing
// the proxy's listeners then would refuse the connections to fail-closed
// Services (capture stays pinned) until a newer agent serves.
func (a *agent) handOver(ctx context.Context) {
	if a.s.handoverWait <= 0 || !a.serving.Load() {
		return
	}
	start := time.Now()
	a.log.Info("serving until a newer agent is ready", "handover_wait", a.s.handoverWait.String(), "health", a.health)
	deadline := time.NewTimer(a.s.handoverWait)
	defer deadline.Stop()
	tick := time.NewTicker(handoverPoll)
	defer tick.Stop()
	for {
		if reason := a.handedOver(ctx); reason != "" {
			a.log.Info("handed over", "reason", reason, "waited", time.Since(start).Round(time.Millisecond).String())
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			a.log.Warn("no newer agent ready: stopping", "handover_wait", a.s.handoverWait.String())
			return
		case <-tick.C:
		}
	}
}

// handedOver says why this agent may stop serving, or "" while it should
// serve on.
func (a *agent) handedOver(ctx context.Context) string {
	// `sockmesh uninstall` unpins every link: no connection is redirected
	// to a proxy any more. A newer agent keeps them pinned.
	if st, err := a.dp.State(); err == nil && !slices.ContainsFunc(st.Hooks, func(h datapath.Hook) bool { return h.LinkPinned }) {
		return "capture removed from the node"
	}
	// The health address is answered by the newest agent that took it
	// over: this one until a newer one starts, which is ready once its
	// proxy has taken this one's addresses over (in node-ip mode) and its
	// first Snapshot is applied: what a rolling update waits for.
	ctx, cancel := context.WithTimeout(ctx, handoverTimeout)
	defer cancel()
	if c, err := askHealth(ctx, a.health, "/readyz"); err == nil && c != a.container {
		return "a newer agent is ready"
	}
	return ""
}
