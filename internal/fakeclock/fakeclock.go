// Package fakeclock is a settable clock for tests of components that take a
// `func() time.Time` (TTLs, back-offs).
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when told. Safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock reading start.
func New(start time.Time) *Clock { return &Clock{t: start} }

// Now reads the clock; pass c.Now where a component takes a clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
