package fleet

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/kvroute/kvroute/internal/poll"
	"github.com/kvroute/kvroute/router"
)

// Index is what the fleet needs of the block index. *index.Index satisfies it.
type Index interface {
	SetWorker(name string, capacityBlocks int) error
	RemoveWorker(name string)
}

// Router is the candidate list the fleet replaces. *router.Router satisfies it.
type Router interface {
	// ValidateWorkers reports what SetWorkers would refuse, before anything changes.
	ValidateWorkers(workers []router.Worker) error
	SetWorkers(workers []router.Worker) error
}

// Watcher is told the workers to poll (health probes, engine-metric scrapes).
// *health.Tracker and *enginemetrics.Scraper satisfy it.
type Watcher interface {
	SetWorkers(targets []poll.Target)
}

// Ledger is the load ledger, which forgets a worker that leaves. *scoring.Bookings
// satisfies it.
type Ledger interface {
	RemoveWorker(name string)
}

// Subscriptions follow the workers' KV event streams. *kvevents.Manager satisfies it.
type Subscriptions interface {
	// SetWorkers starts the streams of added workers and stops those of removed ones,
	// returning once they have stopped.
	SetWorkers(workers []router.Worker)
}

// Deps are the parts of kvroute the fleet keeps in step. Index and Router are required.
type Deps struct {
	Index  Index
	Router Router
	// Bookings, when set, forgets a removed worker's load, so worker names that come
	// and go (pods) do not accumulate in the ledger.
	Bookings Ledger
	Watchers []Watcher
	// Events, when set, subscribes to the KV events of workers that publish them.
	Events Subscriptions
	// DefaultCapacityBlocks is the index's capacity for a worker that has neither
	// capacity_blocks nor a scraped capacity (index.capacity_blocks), for metrics.
	DefaultCapacityBlocks int
}

// Fleet is the worker set in force. Safe for concurrent use; changes are serialised.
type Fleet struct {
	deps    Deps
	mu      sync.Mutex
	workers []router.Worker
	scraped map[string]int // engine-reported capacities in blocks, by worker
}

// Diff is what a change did.
type Diff struct {
	Workers int      `json:"workers"`
	Added   []string `json:"added"`
	Removed []string `json:"removed"`
	Changed []string `json:"changed"`
}

// New registers the initial workers with the index and the watchers, and returns the
// fleet. The router must already have been built with the same workers.
func New(workers []router.Worker, deps Deps) (*Fleet, error) {
	if deps.Index == nil || deps.Router == nil {
		return nil, errors.New("fleet: Index and Router are required")
	}
	f := &Fleet{deps: deps, scraped: map[string]int{}}
	if _, err := f.Apply(workers); err != nil {
		return nil, err
	}
	return f, nil
}

// Workers returns the workers in force, in their configured order.
func (f *Fleet) Workers() []router.Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.workers)
}

// Apply makes next the worker set. Added and changed workers join the index before the
// router may choose them; a worker whose address changed loses its index entries
// (another address is another engine, with another cache); removed workers leave the
// router first and the index last, while requests already on them finish and release
// their bookings. An invalid set changes nothing. An Apply that stops half way (an
// error, or a panic) leaves the workers of both sets in force, for the next one.
func (f *Fleet) Apply(next []router.Worker) (Diff, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// The router's rules (its LoRA adapters included) are checked before anything
	// changes: a refused set leaves the index, watchers and subscriptions as they were.
	if err := f.deps.Router.ValidateWorkers(next); err != nil {
		return Diff{}, fmt.Errorf("fleet: %w", err)
	}
	applied := false
	defer func() {
		if !applied {
			// Stopped half way (an error, or a panic a discovery source's guard recovers):
			// next's workers may have reached the index, the watchers, the router and the
			// subscriptions, or some of them, and the workers in force left some. Both
			// count as in force, so that the next Apply removes whichever it lacks.
			f.workers = merged(next, f.workers)
		}
	}()
	old := make(map[string]router.Worker, len(f.workers))
	for _, w := range f.workers {
		old[w.Name] = w
	}
	diff := Diff{Workers: len(next)}
	kept := make(map[string]bool, len(next))
	for _, w := range next {
		kept[w.Name] = true
		prev, existed := old[w.Name]
		switch {
		case !existed:
			diff.Added = append(diff.Added, w.Name)
		case !reflect.DeepEqual(prev, w):
			diff.Changed = append(diff.Changed, w.Name)
		default:
			continue
		}
		if existed && prev.Address != w.Address {
			delete(f.scraped, w.Name) // another engine: its capacity is yet to be read
		}
		// A new address's engine starts empty: the router clears it (SetWorkers), between
		// two decisions, so no decision under way records the old engine's blocks on it.
		if err := f.deps.Index.SetWorker(w.Name, f.capacityLocked(w).blocks); err != nil {
			return Diff{}, fmt.Errorf("fleet: %w", err)
		}
	}
	targets := Targets(next)
	for _, w := range f.deps.Watchers {
		w.SetWorkers(targets)
	}
	if err := f.deps.Router.SetWorkers(next); err != nil {
		return Diff{}, fmt.Errorf("fleet: %w", err)
	}
	if f.deps.Events != nil {
		// After the index knows every added worker; before it forgets removed ones,
		// whose subscribers must stop applying events first.
		f.deps.Events.SetWorkers(f.eventWorkersLocked(next))
	}
	for _, w := range f.workers {
		if !kept[w.Name] {
			diff.Removed = append(diff.Removed, w.Name)
			f.deps.Index.RemoveWorker(w.Name)
			if f.deps.Bookings != nil {
				f.deps.Bookings.RemoveWorker(w.Name)
			}
			delete(f.scraped, w.Name)
		}
	}
	f.workers = slices.Clone(next)
	applied = true
	return diff, nil
}

// merged returns the workers of next, then those of before that next does not name.
func merged(next, before []router.Worker) []router.Worker {
	named := make(map[string]bool, len(next))
	for _, w := range next {
		named[w.Name] = true
	}
	out := slices.Clone(next)
	for _, w := range before {
		if !named[w.Name] {
			out = append(out, w)
		}
	}
	return out
}

// Targets is what health probes, metric scrapes and model lists need of the workers:
// where each is, and whether its engine speaks h2c.
func Targets(workers []router.Worker) []poll.Target {
	out := make([]poll.Target, len(workers))
	for i, w := range workers {
		out[i] = poll.Target{Name: w.Name, Address: w.Address, H2C: w.H2C()}
	}
	return out
}

// Names returns the names of the workers in force, in their configured order.
func (f *Fleet) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.workers))
	for i, w := range f.workers {
		out[i] = w.Name
	}
	return out
}
