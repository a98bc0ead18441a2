package router

import (
	"time"

	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/scoring"
)

// Objectives gives the priority of a Gateway API Inference Extension objective (its
// InferenceObjective's spec.priority, or the config's objectives), and whether any
// source defines it. *priority.Objectives satisfies it.
type Objectives interface {
	Priority(objective string) (priority int, found bool)
}

// EngineLoad reports what a worker's engine said of its load at its last reading (its
// waiting requests and the share of its KV cache in use) and how long ago; ok is false
// when there is no reading the scraper still trusts. *enginemetrics.Scraper satisfies
// it.
type EngineLoad interface {
	EngineLoad(worker string) (waiting int, kvUtilization float64, age time.Duration, ok bool)
}

// Priority is the request's priority: its objective's (Request.Objective), 0 for one
// no source defines or without Deps.Objectives. Flow control orders held requests by
// it.
func (r *Router) Priority(req *Request) int { return r.priorityOf(req) }

// priorityOf is the request's priority: its objective's, 0 for one no source defines
// or without Deps.Objectives.
func (r *Router) priorityOf(req *Request) int {
	if r.deps.Objectives == nil || req.Objective == "" {
		return 0
	}
	p, _ := r.deps.Objectives.Priority(req.Objective)
	return p
}

// keepCapacity leaves in scored and candidates (in place, in order) the candidates with
// capacity for a sheddable request (priority.Saturation), and returns how many: each
// candidate's engine reading, with the requests booked on it beyond its batch slots
// (max_num_seqs) counting as its queue. None left means the fleet is saturated for the
// request. Called under decideMu, after the bookings filled the candidates, only for
// sheddable requests.
func (r *Router) keepCapacity(scored []scoring.Candidate, candidates []Worker) int {
	kept := 0
	for i := range scored {
		if r.deps.Saturation.HasCapacity(r.loadOf(&scored[i])) {
			scored[kept], candidates[kept] = scored[i], candidates[i]
			kept++
		}
	}
	return kept
}

// saturated reports whether every candidate is saturated for a request held on
// saturation (Request.HoldOnSaturation): by the Saturation rule of a sheddable request
// (keepCapacity's), but a worker without a fresh engine reading counts as having
// capacity, so that scrapes that fail hold nothing back. Called under decideMu, after
// the bookings filled the candidates.
func (r *Router) saturated(scored []scoring.Candidate) bool {
	for i := range scored {
		if load := r.loadOf(&scored[i]); !r.deps.Saturation.Fresh(load) || r.deps.Saturation.HasCapacity(load) {
			return false
		}
	}
	return len(scored) > 0
}

// loadOf is a candidate's load as the Saturation rule reads it: its engine's reading,
// with the requests booked on it beyond its batch slots (max_num_seqs) as its queue.
func (r *Router) loadOf(c *scoring.Candidate) priority.Load {
	var load priority.Load
	if r.deps.EngineLoad != nil {
		load.Waiting, load.KVUtilization, load.Age, load.Known = r.deps.EngineLoad.EngineLoad(c.Worker)
	}
	if s := c.MaxNumSeqs; s > 0 {
		load.BookedQueue = max(0, c.ActiveRequests-s)
	}
	return load
}

// HasRoom reports whether worker is under max_active_requests_per_worker (always true
// without one), counting its requests as a decision does: this replica's, its peers'
// and its engine's unseen ones. Flow control looks before it tries a request that
// waits for that worker, rather than make a whole decision (render, encode, look up)
// only to learn that it is still full. A worker no longer in the fleet, or out for a
// health back-off, is no candidate, so no decision waits for it: it has room in this
// sense, and a request waiting for it is tried (and goes to another worker).
func (r *Router) HasRoom(worker string) bool {
	if r.maxActive <= 0 {
		return true
	}
	if _, ok := r.worker(worker); !ok || (r.deps.Health != nil && !r.deps.Health.Eligible(worker)) {
		return true
	}
	load := []scoring.Candidate{{Worker: worker}}
	r.deps.Bookings.Fill(load, nil, "")
	return load[0].ActiveRequests < r.maxActive
}
