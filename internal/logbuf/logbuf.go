// Package logbuf is a log sink for tests: the goroutines of the code under test write
// to it while the test reads what they wrote.
package logbuf

import (
	"strings"
	"sync"
)

// Buffer collects writes; it is safe for concurrent use. The zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
