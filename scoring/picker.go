package scoring

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
)

// ErrNoCandidates is returned by a [Picker] given no candidates: no worker is eligible.
var ErrNoCandidates = errors.New("scoring: no eligible worker")

// Picker chooses the worker for a request: the one selection seam every policy
// implements. Candidates come in a stable order (the caller's worker order), which makes
// seeded tie-breaking reproducible. Pick neither modifies nor retains the candidates
// slice. With no candidates it returns [ErrNoCandidates].
type Picker interface {
	Pick(ctx context.Context, req *Request, candidates []Candidate) (Decision, error)
}

// Decision is a picker's answer.
type Decision struct {
	// Chosen indexes the picked candidate.
	Chosen int
	// Worker names the picked candidate.
	Worker string
	// Fallbacks indexes the other candidates, best first, for an ordered endpoint list.
	Fallbacks []int
	// Terms holds every candidate's cost terms, in candidate order (the explain trace).
	// Policies without a cost leave Cost at 0.
	Terms []Terms
	// BlocksLost is the largest candidate overlap minus the chosen one's: above 0 the
	// choice gave up cached blocks (a non-max-overlap selection).
	BlocksLost int
}

// NonMaxOverlap reports whether another candidate held more of the prompt than the chosen one.
func (d Decision) NonMaxOverlap() bool { return d.BlocksLost > 0 }

// decide builds the decision for candidate chosen, ordering fallbacks by rank (lower
// first, ties in candidate order).
func decide(terms []Terms, chosen int, rank func(i int) float64) Decision {
	maxOverlap := 0
	order := make([]int, 0, len(terms))
	for i, t := range terms {
		maxOverlap = max(maxOverlap, t.Overlap)
		if i != chosen {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ra, rb := rank(a), rank(b)
		switch {
		case ra < rb:
			return -1
		case ra > rb:
			return 1
		}
		return 0
	})
	return Decision{
		Chosen:     chosen,
		Worker:     terms[chosen].Worker,
		Fallbacks:  order,
		Terms:      terms,
		BlocksLost: maxOverlap - terms[chosen].Overlap,
	}
}

// plainTerms wraps candidates for policies that do not price them.
func plainTerms(candidates []Candidate) []Terms {
	terms := make([]Terms, len(candidates))
	for i, c := range candidates {
		terms[i] = Terms{Candidate: c}
	}
	return terms
}

// orRandom returns rng, or a randomly seeded source when rng is nil: the pickers' rule
// for "no seed given".
func orRandom(rng *rand.Rand) *rand.Rand {
	if rng != nil {
		return rng
	}
	return rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
}
