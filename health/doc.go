// Package health decides which workers may be chosen (DESIGN §7). A worker that fails —
// an active probe of its health endpoint fails or times out, or it answers a routed
// request with a 5xx — is taken out of the candidate set after a few consecutive
// failures, for a back-off period that doubles while it keeps failing, and rejoins when
// the period ends; the next failure sends it back at once. When a worker goes down the
// tracker calls OnDown, so the caller can forget the blocks the index credits it with
// (a restarted engine has an empty cache).
//
// The router asks [Tracker.Eligible] per candidate; the ext_proc filter reports upstream
// statuses with [Tracker.Observe]; [Tracker.Run] probes every worker each interval.
// Connect failures never reach the filter (Envoy does not send its own local replies to
// the external processor), so only the probes see a worker that is gone.
package health
