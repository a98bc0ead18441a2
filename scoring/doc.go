// Package scoring is step 6 of a routing decision (DESIGN §2, §3, §5): it keeps each
// worker's load as booked by the router, prices every candidate worker with the cost of
// DESIGN §3, and picks one.
//
// Every policy implements [Picker], the one selection seam: [KVCost] (the cost), and the
// baselines [RoundRobin], [Random] and [LeastLoad]. Costs are in blocks (of block_size
// tokens) and lower is better. [Bookings] is the load ledger: a request is booked on the
// chosen worker, marks its prefill done at its first token and is released at its end,
// each exactly once.
//
// All exported types are safe for concurrent use unless their doc says otherwise.
package scoring
