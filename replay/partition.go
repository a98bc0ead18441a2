package replay

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvroute/kvroute/scoring"
)

// Partition is a replay-only oracle policy for studying placement: it places the n-th
// new prompt prefix (a request whose first block no earlier request had) on the worker
// Assign[n] names (an index into the candidates, in worker order), and every later
// request on the worker of its first block. Sessions therefore never move, whatever the
// index says, and a run measures nothing but the placement of new sessions: replaying
// every Assign of a workload shows what any router that keeps sessions on their worker
// could reach (docs/BENCHMARKS.md, "Workload A: what placement can reach").
type Partition struct {
	Assign []int

	mu    sync.Mutex
	next  int
	owner map[uint64]int // first block hash → candidate index
}

var _ scoring.Picker = (*Partition)(nil)

// Pick implements [scoring.Picker]. A request without a full block goes to the first
// candidate; more new prefixes than Assign names, or an index past the candidates, is an
// error.
func (p *Partition) Pick(_ context.Context, req *scoring.Request, candidates []scoring.Candidate) (scoring.Decision, error) {
	if len(candidates) == 0 {
		return scoring.Decision{}, scoring.ErrNoCandidates
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	chosen := 0
	if len(req.Blocks) > 0 {
		if p.owner == nil {
			p.owner = map[uint64]int{}
		}
		w, seen := p.owner[req.Blocks[0]]
		if !seen {
			if p.next >= len(p.Assign) {
				return scoring.Decision{}, fmt.Errorf("partition: new prefix %d has no worker (%d given)", p.next+1, len(p.Assign))
			}
			w = p.Assign[p.next]
			p.next++
			p.owner[req.Blocks[0]] = w
		}
		if w >= len(candidates) {
			return scoring.Decision{}, fmt.Errorf("partition: worker %d of %d candidates", w, len(candidates))
		}
		chosen = w
	}
	terms := make([]scoring.Terms, len(candidates))
	maxOverlap := 0
	for i, c := range candidates {
		terms[i] = scoring.Terms{Candidate: c}
		maxOverlap = max(maxOverlap, c.Overlap)
	}
	var fallbacks []int
	for i := range candidates {
		if i != chosen {
			fallbacks = append(fallbacks, i)
		}
	}
	return scoring.Decision{Chosen: chosen, Worker: candidates[chosen].Worker, Fallbacks: fallbacks, Terms: terms,
		BlocksLost: maxOverlap - candidates[chosen].Overlap}, nil
}

// parsePartition reads the digits of a partition:<digits> policy, one worker index
// (0–9) per new prefix.
func parsePartition(spec, digits string) (*Partition, error) {
	if digits == "" {
		return nil, fmt.Errorf("policy %q: partition needs one worker digit per new prefix, e.g. partition:0110", spec)
	}
	p := &Partition{Assign: make([]int, 0, len(digits))}
	for _, d := range digits {
		if d < '0' || d > '9' {
			return nil, fmt.Errorf("policy %q: %q is not a worker digit (0–9)", spec, d)
		}
		p.Assign = append(p.Assign, int(d-'0'))
	}
	return p, nil
}
