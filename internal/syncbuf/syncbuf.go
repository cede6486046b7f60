// Package syncbuf is a strings.Builder that several goroutines may write
// (a logger's output in a test) while the test reads it.
package syncbuf

import (
	"strings"
	"sync"
)

// Buffer is safe for concurrent Write and String. The zero value is empty.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
