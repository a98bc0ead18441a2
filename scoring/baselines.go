package scoring

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// RoundRobin picks candidates in turn, ignoring cache and load. The zero value is ready
// to use.
type RoundRobin struct {
	next atomic.Uint64
}

var _ Picker = (*RoundRobin)(nil)

// Pick implements [Picker].
func (r *RoundRobin) Pick(_ context.Context, _ *Request, candidates []Candidate) (Decision, error) {
	if len(candidates) == 0 {
		return Decision{}, ErrNoCandidates
	}
	n := len(candidates)
	chosen := int((r.next.Add(1) - 1) % uint64(n))
	// Fallbacks continue the rotation from the chosen worker.
	return decide(plainTerms(candidates), chosen, func(i int) float64 { return float64((i - chosen + n) % n) }), nil
}

// Random picks a candidate uniformly at random, ignoring cache and load.
type Random struct {
	mu  sync.Mutex
	rng *rand.Rand
}

var _ Picker = (*Random)(nil)

// NewRandom returns a Random picker drawing from rng (nil: a randomly seeded source).
func NewRandom(rng *rand.Rand) *Random {
	return &Random{rng: orRandom(rng)}
}

// Pick implements [Picker].
func (r *Random) Pick(_ context.Context, _ *Request, candidates []Candidate) (Decision, error) {
	if len(candidates) == 0 {
		return Decision{}, ErrNoCandidates
	}
	r.mu.Lock()
	chosen := r.rng.IntN(len(candidates))
	r.mu.Unlock()
	return decide(plainTerms(candidates), chosen, func(int) float64 { return 0 }), nil
}

// LeastLoad picks the candidate with the fewest active requests, then the fewest pending
// prefill tokens, ignoring cache; remaining ties go to the first candidate in order.
// The zero value is ready to use.
type LeastLoad struct{}

var _ Picker = LeastLoad{}

// Pick implements [Picker].
func (LeastLoad) Pick(_ context.Context, _ *Request, candidates []Candidate) (Decision, error) {
	if len(candidates) == 0 {
		return Decision{}, ErrNoCandidates
	}
	// Prefill tokens are below 2^40 in any fleet, so one float orders by N, then P.
	rank := func(i int) float64 {
		return float64(candidates[i].ActiveRequests)*(1<<40) + float64(candidates[i].PrefillTokens)
	}
	chosen := 0
	for i := range candidates {
		if rank(i) < rank(chosen) {
			chosen = i
		}
	}
	return decide(plainTerms(candidates), chosen, rank), nil
}
