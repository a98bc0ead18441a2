// Package background runs the units of work of kvroute's background loops (a health
// probe, a metrics scrape or a model list read of one worker, one KV events message,
// one peer's report, one discovery sync) so that a panic in one costs that unit, not
// the process: kvroute's background goroutines read what engines, peers and the
// cluster send, and a bug such input reaches there would otherwise end every request
// in flight. gRPC handlers have their own recovery (package server).
//
// A [Guard] recovers the panic, logs it at Error with its stack, counts it in
// kvroute_background_panics_total{loop} and returns it as an error wrapping
// [ErrPanicked]. What a lost unit means for the loop's state is the loop's to say, and
// each says it as it handles a failed unit of its own kind: a probe or scrape that
// failed, a KV events batch that was lost, a report it refuses, an input it rejects.
// A loop must not hold a lock across a unit unless it is released by a defer.
//
// Guards and Metrics are safe for concurrent use.
package background
