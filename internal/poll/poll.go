// Package poll runs periodic work (health probes, metrics scrapes) until cancelled.
package poll

import (
	"context"
	"time"
)

// Every calls f at once and then every interval until ctx is done; it returns after
// the last call. A call that outlasts the interval delays the next one rather than
// overlapping it.
func Every(ctx context.Context, interval time.Duration, f func(context.Context)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		f(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
