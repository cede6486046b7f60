package datapath

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Decision is what a connect hook did with one TCP connect() (enum
// sm_decision in bpf/sockmesh.h).
type Decision uint32

// The decisions, in counter order. sm_decide (bpf/sockmesh.c) checks the
// skips and the denial in the order listed, so that each counter answers
// one question, and redirects when none applies.
const (
	// Redirected: rewritten to the enrolment's proxy address.
	Redirected = Decision(sockmeshSmDecisionSM_REDIRECTED)
	// SkippedNotEnrolled: the socket's netns is not enrolled.
	SkippedNotEnrolled = Decision(sockmeshSmDecisionSM_SKIP_NOT_ENROLLED)
	// SkippedNoService: {address, port, TCP} is not in the services map.
	SkippedNoService = Decision(sockmeshSmDecisionSM_SKIP_NO_SERVICE)
	// SkippedMarked: the socket carries the proxy's mark in the netns the
	// proxy dials from (the proxy's own upstream connection). A pod's
	// socket carrying the mark is decided like any other.
	SkippedMarked = Decision(sockmeshSmDecisionSM_SKIP_MARKED)
	// SkippedProxyStale: a fail-open service while the proxy's heartbeat
	// is stale.
	SkippedProxyStale = Decision(sockmeshSmDecisionSM_SKIP_PROXY_STALE)
	// SkippedNoProxy: a fail-open service, and the enrolment has no
	// listener in the connection's family.
	SkippedNoProxy = Decision(sockmeshSmDecisionSM_SKIP_NO_PROXY)
	// DeniedNoProxy: a fail-closed service, and the enrolment has no
	// listener in the connection's family; connect() fails with EPERM.
	DeniedNoProxy = Decision(sockmeshSmDecisionSM_DENIED_NO_PROXY)

	numDecisions = Decision(sockmeshSmDecisionSM_DECISION_MAX)
)

// Decisions lists every Decision, in counter order.
func Decisions() []Decision {
	out := make([]Decision, numDecisions)
	for i := range out {
		out[i] = Decision(i)
	}
	return out
}

// String is the decision's metric label.
func (d Decision) String() string {
	switch d {
	case Redirected:
		return "redirected"
	case SkippedNotEnrolled:
		return "skipped_not_enrolled"
	case SkippedNoService:
		return "skipped_no_service"
	case SkippedMarked:
		return "skipped_marked"
	case SkippedProxyStale:
		return "skipped_proxy_stale"
	case SkippedNoProxy:
		return "skipped_no_proxy"
	case DeniedNoProxy:
		return "denied_no_proxy"
	}
	return fmt.Sprintf("decision_%d", uint32(d))
}

// MarshalText writes the decision's metric label, so that maps keyed by
// Decision marshal to JSON and YAML with readable keys.
func (d Decision) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a metric label that String wrote.
func (d *Decision) UnmarshalText(b []byte) error {
	for _, dec := range Decisions() {
		if dec.String() == string(b) {
			*d = dec
			return nil
		}
	}
	return fmt.Errorf("unknown datapath decision %q", b)
}

// Counters returns how many TCP connects each decision has taken since the
// counters map was created (it survives restarts; Uninstall resets it).
// Connects of other protocols are not counted.
func (d *Datapath) Counters() (map[Decision]uint64, error) {
	out := make(map[Decision]uint64, numDecisions)
	var perCPU []uint64
	for _, dec := range Decisions() {
		key := uint32(dec)
		if err := d.objs.SmCounters.Lookup(&key, &perCPU); err != nil {
			return nil, fmt.Errorf("read counter %s: %w", dec, err)
		}
		var sum uint64
		for _, n := range perCPU {
			sum += n
		}
		out[dec] = sum
	}
	return out, nil
}

// Heartbeat records that the proxy is alive now, and takes the datapath
// back if the agent that took it over has exited (owner.go). Fail-open
// services stop being redirected once the last heartbeat is older than
// Config.HeartbeatMaxAge, so the process serving the proxy should call it
// well within that period (e.g. every HeartbeatMaxAge/3). A proxy that never
// beat counts as stale. An error wrapping ErrOwnerCheck comes after the
// heartbeat was written.
func (d *Datapath) Heartbeat() error {
	var ts unix.Timespec
	// CLOCK_MONOTONIC is the clock of bpf_ktime_get_ns.
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	key, now := uint32(0), uint64(ts.Nano())
	if err := d.objs.SmHeartbeat.Put(&key, &now); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	// Each beat also notices a newer agent's takeover, or its exit.
	if err := d.checkOwner(); err != nil {
		return fmt.Errorf("heartbeat written: %w: %w", ErrOwnerCheck, err)
	}
	return nil
}
