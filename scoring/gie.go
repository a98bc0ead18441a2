package scoring

import (
	"context"
	"math/rand/v2"
	"sync"
)

// GIE is a baseline of the Gateway API Inference Extension endpoint picker's default
// scoring: a weighted sum of the prefix-match fraction (×3), a queue score (×2: fewest
// waiting requests scores 1, most scores 0) and a KV-cache score (×2: 1 − utilisation);
// the highest score wins, exact ties at random. Scores are unitless and higher is
// better: this is the only picker that renormalises, to reproduce the peer.
type GIE struct {
	mu  sync.Mutex
	rng *rand.Rand
	// loraWeight weighs the LoRA-affinity score (0: the default profile, without it).
	loraWeight float64
}

var _ Picker = (*GIE)(nil)

// NewGIE returns the baseline drawing ties from rng (nil: a randomly seeded source).
func NewGIE(rng *rand.Rand) *GIE {
	return &GIE{rng: orRandom(rng)}
}

// NewGIEWithLoRA returns the baseline with GIE's lora-affinity scorer added at weight
// (deployments serving adapters add it; 1 next to the default three): 1 where the
// engine runs the request's adapter, 0.8 where it has a slot free, 0.6 where the
// adapter waits for one, 0 where every slot is taken, from the engines' reports
// (Candidate.EngineLoRA).
func NewGIEWithLoRA(rng *rand.Rand, weight float64) *GIE {
	return &GIE{rng: orRandom(rng), loraWeight: weight}
}

// loraAffinity is GIE's lora-affinity score of a state.
func loraAffinity(s LoRAState) float64 {
	switch s {
	case LoRARunning:
		return 1
	case LoRASlotFree:
		return 0.8
	case LoRAQueued:
		return 0.6
	}
	return 0
}

// Pick implements [Picker]. Each candidate's Terms.Cost holds its negated score, so
// lower is still better in the decision's terms.
func (g *GIE) Pick(_ context.Context, req *Request, candidates []Candidate) (Decision, error) {
	if len(candidates) == 0 {
		return Decision{}, ErrNoCandidates
	}
	minQ, maxQ := candidates[0].Waiting, candidates[0].Waiting
	for _, c := range candidates {
		minQ, maxQ = min(minQ, c.Waiting), max(maxQ, c.Waiting)
	}
	terms := plainTerms(candidates)
	for i, c := range candidates {
		prefix := 0.0
		if len(req.Blocks) > 0 {
			prefix = float64(c.Overlap) / float64(len(req.Blocks))
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-c.Waiting) / float64(maxQ-minQ)
		}
		terms[i].Cost = -(3*prefix + 2*queue + 2*(1-c.KVUtilization) + g.loraWeight*loraAffinity(c.EngineLoRA))
	}
	g.mu.Lock()
	chosen := argminPick(terms, g.rng)
	g.mu.Unlock()
	return decide(terms, chosen, func(i int) float64 { return terms[i].Cost }), nil
}
