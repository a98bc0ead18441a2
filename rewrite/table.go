package rewrite

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
)

// Choice is the target a rewrite chose for a request.
type Choice struct {
	// Rewrite names the rewrite whose rule matched; Target is the model drawn.
	Rewrite, Target string
}

// Table holds the rewrites in force, the config's (SetConfigured) and the cluster's
// (SetCluster), and chooses requests' targets. Lookups read an immutable merged index
// without a lock; drawing a target takes the RNG's lock. Build it with [NewTable].
//
// Precedence, as GIE's endpoint picker reads InferenceModelRewrites: a rule naming the
// request's model exactly wins over a generic one (no models), wherever each is; among
// the rules of one kind, the cluster's come before the config's (an InferenceModelRewrite
// wins over the config, as an InferenceObjective does), each source's in its order (the
// cluster's oldest first, the config's as listed), and one rewrite's rules in their
// order. A rewrite of the cluster named as one of the config's replaces it.
type Table struct {
	mu         sync.Mutex // serialises updates
	configured []Rewrite
	cluster    []Rewrite
	merged     atomic.Pointer[lookup]
	inForce    map[series]bool // the (rewrite, target) pairs of the last merge

	rngMu   sync.Mutex
	rng     Rand
	metrics *Metrics
}

// Rand is the random source targets are drawn from. *rand.Rand (math/rand/v2)
// satisfies it.
type Rand interface {
	// IntN and Int64N return a value in [0, n).
	IntN(n int) int
	Int64N(n int64) int64
}

// lookup is the merged index: each model's first exact rule, and the first generic one.
type lookup struct {
	exact   map[string]*rule
	generic *rule
}

// rule is a rule ready to draw from: its rewrite's name, its targets and their weights'
// running sums (all 0: equal shares). A target of weight 0 beside weighted ones adds
// nothing to the sum, so no draw lands on it.
type rule struct {
	rewrite string
	targets []string
	cum     []int64 // cum[i]: the weights of targets[:i+1]; nil when unweighted
}

// NewTable returns a table of the config's rewrites (validated by Config.Validate),
// drawing targets from rng (nil: a randomly seeded one); m may be nil (no metrics). rng
// is used under the table's lock only: give it a source of its own, seeded for
// reproducible runs.
func NewTable(configured Config, rng Rand, m *Metrics) *Table {
	if rng == nil {
		rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	t := &Table{rng: rng, metrics: m}
	t.SetConfigured(configured)
	return t
}

// SetConfigured replaces the config's rewrites (validated). The slice is copied.
func (t *Table) SetConfigured(c Config) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.configured = slices.Clone(c)
	t.merge()
}

// SetCluster replaces the cluster's rewrites of the pool, in precedence order (oldest
// first), each valid but for mixed weights (Rewrite.Check). The slice is copied.
func (t *Table) SetCluster(rewrites []Rewrite) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cluster = slices.Clone(rewrites)
	t.merge()
}

// Len returns how many rewrites are in force (the config's and the cluster's; one the
// cluster replaces counts once).
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ordered())
}

// ordered returns the rewrites in precedence order: the cluster's, then the config's
// that no cluster rewrite replaces. Called under mu.
func (t *Table) ordered() []Rewrite {
	out := slices.Clone(t.cluster)
	for _, rw := range t.configured {
		if !slices.ContainsFunc(t.cluster, func(c Rewrite) bool { return c.Name == rw.Name }) {
			out = append(out, rw)
		}
	}
	return out
}

// series names one (rewrite, target) series of the metric.
type series struct{ rewrite, target string }

// merge publishes the index of both sources, and drops the series of the pairs no
// longer in force: rewrites are named by their configs and objects, and names churned
// through (a canary's InferenceModelRewrite per rollout) would otherwise keep their
// series for the life of the process. A request that drew from the old index as it was
// replaced may count once more after the drop (Choose takes no lock): one series back,
// per such change at most per request in flight. Called under mu.
func (t *Table) merge() {
	l := &lookup{exact: map[string]*rule{}}
	inForce := map[series]bool{}
	for _, rw := range t.ordered() {
		for _, r := range rw.Rules {
			for _, tg := range r.Targets {
				inForce[series{rw.Name, tg.Model}] = true
			}
			built := newRule(rw.Name, r)
			if len(r.Models) == 0 {
				if l.generic == nil {
					l.generic = built
				}
				continue
			}
			for _, m := range r.Models {
				if _, ok := l.exact[m]; !ok {
					l.exact[m] = built
				}
			}
		}
	}
	t.merged.Store(l)
	for pair := range t.inForce {
		if !inForce[pair] {
			t.metrics.forget(pair.rewrite, pair.target)
		}
	}
	t.inForce = inForce
}

func newRule(name string, r Rule) *rule {
	out := &rule{rewrite: name, targets: make([]string, len(r.Targets))}
	var sum int64
	for i, tg := range r.Targets {
		out.targets[i] = tg.Model
		sum += int64(tg.Weight)
	}
	if sum > 0 {
		out.cum = make([]int64, len(r.Targets))
		sum = 0
		for i, tg := range r.Targets {
			sum += int64(tg.Weight)
			out.cum[i] = sum
		}
	}
	return out
}

// Choose returns the target of a request for model, drawn from the matching rule's
// targets by weight, and false when no rule matches (the request is left as it is).
// The target may be model itself (a split that keeps a share on it). Each choice is
// counted by rewrite and target.
func (t *Table) Choose(model string) (Choice, bool) {
	if t == nil {
		return Choice{}, false
	}
	l := t.merged.Load()
	if l == nil {
		return Choice{}, false
	}
	r, ok := l.exact[model]
	if !ok {
		if r = l.generic; r == nil {
			return Choice{}, false
		}
	}
	c := Choice{Rewrite: r.rewrite, Target: r.targets[t.draw(r)]}
	t.metrics.chose(c)
	return c, true
}

// draw returns the index of a target of r: by weight (never one of weight 0), or
// uniformly when every weight is 0.
func (t *Table) draw(r *rule) int {
	if len(r.targets) == 1 {
		return 0 // an alias: no draw
	}
	t.rngMu.Lock()
	var n int64
	if r.cum == nil {
		n = int64(t.rng.IntN(len(r.targets)))
	} else {
		n = t.rng.Int64N(r.cum[len(r.cum)-1])
	}
	t.rngMu.Unlock()
	if r.cum == nil {
		return int(n)
	}
	i, _ := slices.BinarySearchFunc(r.cum, n, func(sum, n int64) int {
		if sum <= n {
			return -1
		}
		return 1
	})
	return i
}
