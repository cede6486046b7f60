package controlplane

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// refusals are the API server's answers about one object that sending the
// same request again cannot change, with the metric label of each: RBAC
// when no access review could confirm it (the Gate holds back the resource
// of one it confirms), a used-up quota (403; a quota freed by deleting a
// Service is a watch event, so a new translation tries again), an
// admission webhook's denial
// (403, 400 or 422 as it says), an object the API refuses as written (422,
// 400, 413, 405), and one or its namespace or kind gone since translate saw
// it (404: the deletion brings a new translation too). Anything else — a
// conflict RetryOnConflict gave up on, 429, 5xx, a timeout, a network
// error, an error of no API status — may clear by itself.
var refusals = []struct {
	reason string
	is     func(error) bool
}{
	{"forbidden", apierrors.IsForbidden},
	{"invalid", apierrors.IsInvalid},
	{"bad_request", apierrors.IsBadRequest},
	{"not_found", apierrors.IsNotFound},
	{"too_large", apierrors.IsRequestEntityTooLargeError},
	{"method_not_allowed", apierrors.IsMethodNotSupported},
}

// Retryable reports whether the write loop retries err, a Writer's error,
// with backoff: yes unless err is nil or each error it joins is the API
// server refusing one object for good (Forbidden, Invalid, BadRequest,
// NotFound, RequestEntityTooLarge, MethodNotSupported), which waits for the
// next translation instead. Writers must keep the API server's status in
// each error they return (wrap with %w); an error without one is retried.
// The errors the Gate took over (objectScoped, RBAC's) never reach the
// loop: a retry of theirs is the object's or the resource's alone.
func Retryable(err error) bool {
	for _, e := range leaves(err) {
		if refusal(e) == "" {
			return true
		}
	}
	return false
}

// objectScoped reports whether err, a write's error that may clear, is
// about its object alone, so that the Gate retries the object by itself
// while every other write goes on: a 500 InternalError (the API server
// answered, and failed this request: above all an admission webhook it
// could not call or that timed out, failurePolicy Fail, for one kind or
// namespace) or a conflict RetryOnConflict gave up on (another writer keeps
// changing the object). 429, 503, 504, a ServerTimeout, a client timeout
// or a network error say the API server, or the way to it, is in trouble:
// every write waits.
func objectScoped(err error) bool {
	return every(err, func(e error) bool { return apierrors.IsInternalError(e) || apierrors.IsConflict(e) })
}

// every reports whether each error err joins satisfies is, and err is not
// nil.
func every(err error, is func(error) bool) bool {
	ls := leaves(err)
	for _, e := range ls {
		if !is(e) {
			return false
		}
	}
	return len(ls) > 0
}

// refusal returns the reason label of leaf, an error that joins no others,
// if the API server refused its object for good; "" if it may clear.
func refusal(leaf error) string {
	for _, r := range refusals {
		if r.is(leaf) {
			return r.reason
		}
	}
	return ""
}

// leaves splits err into the errors it joins (errors.Join, several %w),
// each kept with its own wrapping. Each must be classified alone: errors.As
// on a join matches when any one of them does, so one refusal would hide a
// retryable error beside it.
func leaves(err error) []error {
	if err == nil {
		return nil
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			var out []error
			for _, inner := range j.Unwrap() {
				out = append(out, leaves(inner)...)
			}
			return out
		}
	}
	return []error{err}
}
