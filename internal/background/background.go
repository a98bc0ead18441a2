package background

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
)

// The loops, the `loop` label of kvroute_background_panics_total.
const (
	LoopScrape    = "scrape"    // engine metrics, per worker and interval (package enginemetrics)
	LoopHealth    = "health"    // health probes, per worker and interval (package health)
	LoopModels    = "models"    // engine model lists, per worker and interval (package enginemodels)
	LoopKVEvents  = "kv_events" // KV events, per message (package kvevents)
	LoopPeers     = "peers"     // the other replicas' reports, per report, and their DNS lookups (package peers)
	LoopDiscovery = "discovery" // worker discovery, per sync (packages discovery and discovery/kube)
	// LoopFlowControl: flow control's questions to the router about a held request,
	// asked under its queue's lock (is its worker's slot free, does it still wait for
	// that worker; package flowcontrol).
	LoopFlowControl = "flow_control"
)

// ErrPanicked is wrapped by the error [Guard.Do] returns for a unit that panicked.
var ErrPanicked = errors.New("panicked")

// A Guard runs the units of work of one background loop. The zero Guard recovers
// panics too, but logs and counts nothing.
type Guard struct {
	loop    string
	log     *slog.Logger
	metrics *Metrics
}

// NewGuard returns the guard of loop (one of the Loop constants), logging to log and
// counting in m; either may be nil (nothing logged, nothing counted). The loop's
// series starts at 0.
func NewGuard(loop string, log *slog.Logger, m *Metrics) Guard {
	m.start(loop)
	return Guard{loop: loop, log: log, metrics: m}
}

// Do runs f, one unit of work, and returns its error. A panic in f is recovered,
// logged at Error with its stack, counted, and returned as an error wrapping
// [ErrPanicked] that names the panic's value. Deferred calls in f run as the panic
// unwinds, before Do returns.
func (g Guard) Do(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			g.metrics.panicked(g.loop)
			if g.log != nil {
				g.log.Error("background loop panicked: the unit of work is lost, the loop goes on", "loop", g.loop, "panic", r, "stack", string(debug.Stack()))
			}
			err = fmt.Errorf("%w: %v", ErrPanicked, r)
		}
	}()
	return f()
}
