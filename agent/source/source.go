// Package source defines what a config source is: something that lists and
// watches the objects translate.Translate reads, and says when they may
// have changed. The kubernetes source (informers) and the file source (a
// directory of manifests) implement it; the agent runs one and rebuilds the
// Snapshot on each signal.
//
// A source only lists, watches and signals. It must not translate, write
// status or decide policy, and it never mutates an object after handing it
// out.
package source

import (
	"context"

	"github.com/sockmesh/sockmesh/agent/translate"
)

// Source is a config source.
//
// The agent's loop is: start Run; wait for Changed; call Input, complete
// it, Translate, publish; wait for Changed again. Changes that arrive while
// the agent is busy coalesce into one signal, so one rebuild covers every
// kind. A source fills the object lists and what only it can know (the
// kubernetes source: Node from the Node object, and
// ClusterTrustBundlesUnavailable from discovery); the agent sets Now and
// Resolved and adds its own configuration to Node (service CIDRs, egress
// allow-list). The file source fills the object lists only.
type Source interface {
	// Run lists and watches until ctx is done, then returns nil. It returns
	// an error only when the source cannot start (a missing directory, an
	// unreachable API server at start-up); once running, bad input is
	// reported and the last good objects stay in place.
	Run(ctx context.Context) error
	// Changed receives a value whenever Input may have changed. The channel
	// has a buffer of one and sends never block, so signals coalesce. The
	// first signal comes only once Input is complete (the initial listing
	// of every kind is done): the agent must not translate before it, since
	// a partial Input would drop capture for what is not listed yet.
	Changed() <-chan struct{}
	// Input returns the current objects. The slices and objects are shared
	// and read-only: callers must not modify them, and the source never
	// does once it has handed them out (it builds new slices instead).
	Input() translate.Input
}
