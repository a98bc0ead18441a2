package scoring

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
)

// KVCost picks the candidate of lowest cost (DESIGN §3). Exact ties are broken uniformly
// at random; with Temperature > 0 it samples a softmax over min-max normalised costs.
type KVCost struct {
	policy *Policy
	mu     sync.Mutex // guards rng, which is not safe for concurrent use
	rng    *rand.Rand
}

var _ Picker = (*KVCost)(nil)

// NewKVCost returns a KVCost picker with validated params. rng drives tie-breaking and
// sampling: pass a seeded source for reproducible runs; nil means a randomly seeded one.
func NewKVCost(params Params, rng *rand.Rand) (*KVCost, error) {
	policy, err := NewPolicy(params)
	if err != nil {
		return nil, err
	}
	return NewKVCostWithPolicy(policy, rng), nil
}

// NewKVCostWithPolicy returns a KVCost picker that prices each decision with the
// parameters policy holds at that moment, so runtime updates take effect on the next
// decision.
func NewKVCostWithPolicy(policy *Policy, rng *rand.Rand) *KVCost {
	return &KVCost{policy: policy, rng: orRandom(rng)}
}

// Pick implements [Picker].
func (k *KVCost) Pick(_ context.Context, req *Request, candidates []Candidate) (Decision, error) {
	if len(candidates) == 0 {
		return Decision{}, ErrNoCandidates
	}
	params := k.policy.Params()
	if req.Params != nil {
		if err := req.Params.Validate(); err != nil {
			return Decision{}, err
		}
		params = *req.Params
	}
	priced := *req // Pick must not modify the caller's request
	priced.SharedPrefixBlocks = 0
	for _, c := range candidates {
		priced.SharedPrefixBlocks = max(priced.SharedPrefixBlocks, c.SharedBlocks)
	}
	terms := make([]Terms, len(candidates))
	for i, c := range candidates {
		terms[i] = params.Cost(&priced, c)
	}
	k.mu.Lock()
	var chosen int
	if params.Temperature > 0 {
		chosen = softmaxPick(terms, params.Temperature, k.rng)
	} else {
		chosen = argminPick(terms, k.rng)
	}
	k.mu.Unlock()
	return decide(terms, chosen, func(i int) float64 { return terms[i].Cost }), nil
}

// argminPick returns the lowest-cost candidate, choosing uniformly among exact ties by
// reservoir sampling so the RNG is consulted only when there is a tie.
func argminPick(terms []Terms, rng *rand.Rand) int {
	best, ties := 0, 1
	for i := 1; i < len(terms); i++ {
		switch c := terms[i].Cost; {
		case c < terms[best].Cost:
			best, ties = i, 1
		case c == terms[best].Cost:
			ties++
			if rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// softmaxPick samples a candidate with probability ∝ exp(−cost'/T), cost' the cost
// normalised to [0,1] by the candidates' min and max.
func softmaxPick(terms []Terms, temperature float64, rng *rand.Rand) int {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, t := range terms {
		lo, hi = math.Min(lo, t.Cost), math.Max(hi, t.Cost)
	}
	span := hi - lo
	weights := make([]float64, len(terms))
	var total float64
	for i, t := range terms {
		norm := 0.0
		if span > 0 {
			norm = (t.Cost - lo) / span
		}
		weights[i] = math.Exp(-norm / temperature)
		total += weights[i]
	}
	r := rng.Float64() * total
	for i, w := range weights {
		if r < w {
			return i
		}
		r -= w
	}
	return len(terms) - 1 // rounding left r just past the last weight
}
