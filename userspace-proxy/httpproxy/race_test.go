//go:build race

package httpproxy

// raceEnabled: under the race detector sync.Pool drops a quarter of what
// it is given, so tests cannot count on it keeping what is put back.
const raceEnabled = true
