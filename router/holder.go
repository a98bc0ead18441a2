package router

import (
	"slices"

	"github.com/kvroute/kvroute/scoring"
)

// holderOf is the worker a request waits for when it asks to (Request.WaitForHolder,
// flow control's holder_wait), "" for none: the full worker (at maxActive requests)
// holding the most of its prompt's blocks (n of them), when it holds more than half of
// them beyond what every other candidate holds, full or free, and beyond a hot shared
// prefix (the leading blocks two requests active on a worker use: SharedBlocks).
// scored are the candidates with their overlaps and bookings filled.
//
// Sent to another worker, such a request (a session's turn on its worker) would
// compute those blocks again, and the session would move. A prefix many prompts share
// (a template's header, a system prompt) is no reason to wait: a request that other
// workers could serve as well waits for the first that frees, and one whose system
// prompt only its holder has computed yet would otherwise wait there with every new
// session behind that prompt, which then never spreads.
func holderOf(scored []scoring.Candidate, maxActive, n int) string {
	fullBest, otherBest, holder := 0, 0, ""
	for i := range scored {
		c := &scored[i]
		otherBest = max(otherBest, c.SharedBlocks)
		switch {
		case c.ActiveRequests < maxActive:
			otherBest = max(otherBest, c.Overlap)
		case c.Overlap > fullBest:
			otherBest = max(otherBest, fullBest)
			fullBest, holder = c.Overlap, c.Worker
		default:
			otherBest = max(otherBest, c.Overlap)
		}
	}
	if 2*(fullBest-otherBest) > n {
		return holder
	}
	return ""
}

// StillWaits reports whether the request Route refused with busy would be refused so
// again, for the same worker: among the request's candidates now (destinationsOf, as a
// decision takes them: a worker out for a health back-off, gone from the fleet, or no
// longer serving the model or the adapter is none, and one back from a back-off or
// added is one), that worker is still at max_active_requests_per_worker and still
// holds more than half of the refused decision's blocks beyond every other candidate
// and a hot shared prefix (holderOf), as the index and the bookings say now. It makes
// no decision (the prompt is not rendered or encoded again, nothing is booked or
// recorded): flow control asks it, once a retry interval, of a request waiting for a
// full worker, so that one whose prompt came to be held elsewhere, whose prefix turned
// into a hot shared one, or whose worker is no longer a candidate, is decided again
// before holder_wait ends. A busy Route did not make (a zero one, a fake's) still
// waits.
func (r *Router) StillWaits(busy *HolderBusyError) bool {
	if busy == nil || busy.blocks == nil {
		return true
	}
	if r.maxActive <= 0 {
		return false
	}
	sc := r.getScratch()
	defer r.putScratch(sc)
	dest, err := r.destinationsOf(&busy.req, sc, busy.fitTokens)
	if err != nil || dest.fit.exceeded {
		// Refused now, or routed by load (the prompt fits no destination's context):
		// decided again, it would not wait.
		return false
	}
	n := len(dest.candidates)
	names := slices.Grow(sc.names[:0], n)[:n]
	sc.names = names
	scored := slices.Grow(sc.scored[:0], n)[:n]
	sc.scored = scored
	clear(scored) // a pooled scratch holds the last decision's candidates
	overlaps := slices.Grow(sc.ints[:0], n)[:n]
	sc.ints = overlaps
	for i, w := range dest.candidates {
		names[i] = w.Name
	}
	r.deps.Index.Overlaps(busy.blocks, names, overlaps)
	for i, name := range names {
		scored[i].Worker, scored[i].Overlap = name, overlaps[i]
	}
	r.deps.Bookings.Fill(scored, busy.blocks, "")
	return holderOf(scored, r.maxActive, len(busy.blocks)) == busy.Worker
}
