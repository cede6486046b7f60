// Package retrybudget keeps a backend's retry budget (Gateway API
// XBackendTrafficPolicy retryConstraint, snapshot.RetryConstraint): it
// counts the requests and retries the proxy sends to the backend over a
// sliding window (and the retries over the minimum rate's interval, when
// that is longer) and says whether one more retry fits.
//
// A Budget lives with the backend's upstream state and survives snapshot
// swaps while the backend's constraint is unchanged (Carry), so a new
// snapshot does not hand a failing backend a fresh budget. A first try's
// count is an atomic add into a ring of time buckets: no lock (but once
// per slice of the window, to empty its bucket), no allocation per
// request. A retry's check and count are one step under a lock, so
// concurrent retries never pass the budget: it allows exactly as many as
// it would one by one, given the first tries counted by then. A retry
// allowed and then never sent (its app left, or its request timed out,
// during the backoff) is given back (GiveBack).
//
// It must not read the clock (callers pass the time), retry, or answer
// requests: package httpproxy decides what a refused retry becomes (503).
package retrybudget
