// Package router turns a protocol-free request into a routing decision, steps 4–7 of
// DESIGN §2: render and tokenize the prompt, hash its blocks, look up each worker's
// overlap, fill in each worker's booked load, let the policy pick, then book the
// request on the chosen worker and (in approximate mode) record its blocks there.
//
// The ext_proc filter, the replay tool and the simulator all route through [Router], so
// there is one decision path. A [Decision] carries the request's booking: the caller
// marks the first token with [Decision.FirstToken] and ends it with [Decision.Release],
// exactly once, from one place.
//
// [Router] is safe for concurrent use. The index lookups, scoring, booking, recording
// and the session store's update are serialised under one lock, so every decision sees
// the overlaps, footprints, load and session of the one before it.
package router
