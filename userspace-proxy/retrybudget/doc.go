// Package retrybudget keeps a backend's retry budget (Gateway API
// XBackendTrafficPolicy retryConstraint, snapshot.RetryConstraint): it
// counts the requests and retries the proxy sends to the backend over a
// sliding window (and the retries over the minimum rate's interval, when
// that is longer) and says whether one more retry fits.
//
// A Budget lives with the backend's upstream state and survives snapshot
// swaps while the backend's constraint is unchanged (Carry), so a new
// snapshot does not hand a failing backend a fresh budget. Counting is a
// few atomic adds into a ring of time buckets: no lock, no allocation per
// request. Under concurrency the counts are close, not exact (a retry may
// slip past a budget that concurrent retries are exhausting at the same
// instant, and a count landing on a bucket as it rolls over may be lost);
// a budget bounds retry storms, it is not a ledger.
//
// It must not read the clock (callers pass the time), retry, or answer
// requests: package httpproxy decides what a refused retry becomes (503).
package retrybudget
