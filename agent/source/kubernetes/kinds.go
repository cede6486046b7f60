package kubernetes

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"
)

// KindStatus is whether the source watches an optional kind (see the
// package comment) and, when it does not, why.
type KindStatus struct {
	Kind         string `json:"kind"`
	GroupVersion string `json:"groupVersion"`
	// Watched: the kind is listed and its objects reach Input
	// (sockmesh_source_kind_watched is 1).
	Watched bool `json:"watched"`
	// Reason says why the kind is not watched (one of the Kind* reasons),
	// and Error what the API server last answered the source's listing.
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Why an optional kind is not watched.
const (
	// KindNotServed: the API server does not serve the kind (its CRD is
	// not installed, or serves other versions; a built-in API turned off).
	KindNotServed = "NotServed"
	// KindForbidden: the API server serves the kind but refuses the
	// agent's listing (its ClusterRole lacks list or watch on it).
	KindForbidden = "Forbidden"
	// KindListing: the kind's first listing is under way or fails (Error
	// says how), or waits for the others' (at start) or the next
	// discovery to reach Input.
	KindListing = "Listing"
)

// Kinds says which optional kinds the source watches now and why the
// others are not watched, in a fixed order; nil before Run asked the API
// server which kinds it serves.
func (s *Source) Kinds() []KindStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.served == nil {
		return nil
	}
	var listed map[string]cache.Indexer
	if s.l != nil {
		listed = s.l.optional
	}
	out := make([]KindStatus, len(optionalKinds))
	for i, k := range optionalKinds {
		st := KindStatus{Kind: k.kind, GroupVersion: k.groupVersion}
		_, st.Watched = listed[k.kind]
		w := s.watching[k.kind]
		switch {
		case st.Watched:
		case !s.served[k.kind]:
			st.Reason = KindNotServed
		case w == nil || w.err == nil || w.informer.HasSynced():
			st.Reason = KindListing
		case apierrors.IsForbidden(w.err):
			st.Reason, st.Error = KindForbidden, w.err.Error()
		default:
			st.Reason, st.Error = KindListing, w.err.Error()
		}
		out[i] = st
	}
	return out
}
