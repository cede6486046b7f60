// Package must shortens tests that create many objects through calls
// returning (value, error): must.Value(t)(call()) and must.Succeed(t)(call())
// fail the test at once on an error. It is for tests only and holds no
// state.
package must

import "testing"

// Value returns the call's value, failing t if its error is set.
func Value[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// Succeed fails t if the call's error is set, discarding its value.
func Succeed(t testing.TB) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}
