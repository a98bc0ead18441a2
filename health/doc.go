// Package health decides which workers may be chosen (DESIGN §7). A worker that fails —
// an active probe of its health endpoint fails or times out, or it answers a routed
// request with a 5xx — is taken out of the candidate set after a few consecutive
// failures, for a back-off period that doubles while it keeps failing, and rejoins when
// the period ends and it answers (a probe succeeds; without probes, on trial: a failed
// trial sends it back at once). Out again within backoff_max of rejoining, it is out
// twice as long as last time: a worker that flaps does not take its share of requests
// every backoff_min. When a worker goes down the
// tracker calls OnDown, so the caller can forget the blocks the index credits it with
// (a restarted engine has an empty cache).
//
// The router asks [Tracker.Eligible] per candidate; the ext_proc filter reports upstream
// statuses with [Tracker.Observe]; [Tracker.Run] probes every worker each interval.
// Connect failures never reach the filter (Envoy does not send its own local replies to
// the external processor), so only the probes see a worker that is gone.
package health
