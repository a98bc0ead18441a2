package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/router"
)

// Sink receives what a source finds. *Runner implements it; sources call it from one
// goroutine at a time.
type Sink interface {
	// Update offers the complete worker set the source sees now, in a stable order. The
	// first call marks the source synced.
	Update(workers []router.Worker)
	// Reject reports that the source's latest input is unusable (a file that does not
	// parse, a pool whose spec is invalid): the workers in force stay.
	Reject(err error)
	// Missing reports that what the source reads does not exist (an InferencePool not
	// found): no worker is in force, and kvroute is not ready until an Update. It
	// marks the source synced, as Update does.
	Missing(reason error)
}

// Source finds workers.
type Source interface {
	// Run reports to sink each complete worker set it finds, first once its view is
	// complete and then at every change, until ctx is done. It returns ctx's error, or
	// an error that stops discovery for good.
	Run(ctx context.Context, sink Sink) error
}

// Preloaded is a Source that holds a complete worker set before it runs (static, and a
// file read at start): kvroute starts with that set, synced, so it is ready at once.
type Preloaded interface {
	Source
	Workers() []router.Worker
}

// Fleet is where worker sets go. *fleet.Fleet satisfies it.
type Fleet interface {
	Apply(workers []router.Worker) (fleet.Diff, error)
}

// RunnerDeps are a Runner's collaborators. Fleet is required.
type RunnerDeps struct {
	Fleet Fleet
	// OnChange is called, outside the Runner's lock, after each applied set: readiness
	// may have changed.
	OnChange func()
	Metrics  *Metrics
	Logger   *slog.Logger
}

// Runner applies one source's worker sets to the fleet and tracks readiness.
type Runner struct {
	name   string
	source Source
	deps   RunnerDeps

	mu      sync.Mutex
	synced  bool
	applied []router.Worker // the last set applied
	// unsure is set while the fleet may hold part of a set it never took whole: its
	// Apply panicked half way (a source's guard recovered it). The set in force is then
	// applied again when offered, rather than skipped as the fleet's.
	unsure bool
	// missing is why the source has nothing to read (Missing), nil once it has.
	missing error
	// lastReject is the last rejection logged: a source that keeps offering one bad
	// input (an invalid pool, at every pod update) logs it once.
	lastReject string
}

// NewRunner returns a runner of source (named for logs and metrics). A Preloaded
// source's set is applied at once: an error there (a set the fleet refuses) is returned.
func NewRunner(name string, source Source, deps RunnerDeps) (*Runner, error) {
	if source == nil || deps.Fleet == nil {
		return nil, errors.New("discovery: a source and a fleet are required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Runner{name: name, source: source, deps: deps}
	deps.Metrics.setSynced(false)
	if p, ok := source.(Preloaded); ok {
		if _, err := r.apply(p.Workers()); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Apply applies workers from outside the source (a config reload of the static list),
// as Update does, and returns what changed. It makes the Runner the fleet a reloader
// writes to, so that readiness and kvroute_discovery_* follow reloads too.
func (r *Runner) Apply(workers []router.Worker) (fleet.Diff, error) { return r.apply(workers) }

// Workers returns the workers applied last.
func (r *Runner) Workers() []router.Worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.applied)
}

// Run runs the source until ctx is done; a source that stops early is logged, and the
// workers in force stay.
func (r *Runner) Run(ctx context.Context) {
	if err := r.source.Run(ctx, r); err != nil && ctx.Err() == nil {
		r.deps.Logger.Error("worker discovery stopped; the workers in force stay", "source", r.name, "error", err)
	}
}

// Ready reports whether the source has delivered its first complete set and has
// something to read. A set of no workers is ready, as upstream endpoint pickers are
// once synced: a pool scaled to zero is a state of the fleet, whose requests get
// kvroute's 503 no_workers_available (an OpenAI error, counted), not the data plane's
// error for an unreachable processor. A pool that does not exist is not ready
// (Missing): that is a misconfiguration, or the pool is not created yet.
func (r *Runner) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced && r.missing == nil
}

// Synced reports whether the source has delivered its first complete set.
func (r *Runner) Synced() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced
}

// Update implements Sink: it applies workers unless they equal the set in force. A set
// the fleet refuses is rejected whole.
func (r *Runner) Update(workers []router.Worker) {
	if _, err := r.apply(workers); err != nil {
		r.Reject(err)
		return
	}
	r.setMissing(nil)
}

// Missing implements Sink: no worker stays in force, and readiness is off until the
// source finds its input. Readiness turns before the empty set is applied, so a first
// sync to a missing pool is never ready in between.
func (r *Runner) Missing(reason error) {
	r.setMissing(reason)
	if _, err := r.apply(nil); err != nil { // no fleet refuses an empty set; kept for the interface's sake
		r.Reject(err)
	}
}

// setMissing records why the source has nothing to read (nil: it has), and tells
// OnChange when readiness turns with it.
func (r *Runner) setMissing(reason error) {
	r.mu.Lock()
	turned := (r.missing == nil) != (reason == nil)
	r.missing = reason
	r.mu.Unlock()
	if turned && r.deps.OnChange != nil {
		r.deps.OnChange()
	}
}

func (r *Runner) apply(workers []router.Worker) (fleet.Diff, error) {
	diff, first, same, err := r.set(workers)
	switch {
	case err != nil:
		return fleet.Diff{}, err
	case same:
		r.deps.Metrics.setStale(false)
		return diff, nil
	}
	r.deps.Metrics.applied(len(workers))
	if first || len(diff.Added)+len(diff.Removed)+len(diff.Changed) > 0 {
		r.deps.Logger.Info("workers discovered", "source", r.name, "workers", diff.Workers, "added", diff.Added,
			"removed", diff.Removed, "changed", diff.Changed, "first", first)
	}
	if len(workers) == 0 {
		r.deps.Logger.Warn("discovery found no workers: every request gets 503 no_workers_available until one appears", "source", r.name)
	}
	if r.deps.OnChange != nil {
		r.deps.OnChange()
	}
	return diff, nil
}

// set applies workers to the fleet unless they are the set in force (same), and
// makes them the set in force; first says it is the first set. The set in force
// changes only once the fleet has taken a set: one it refused, or whose Apply
// panicked (a source's guard recovered it), is applied again the next time it is
// offered. After such a panic the fleet may hold part of the set it did not take
// (the router routing to a worker the set in force lacks): until the fleet takes a
// set whole, no set is skipped as the one in force, not even that one.
func (r *Runner) set(workers []router.Worker) (diff fleet.Diff, first, same bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.synced && !r.unsure && equal(r.applied, workers) {
		r.lastReject = ""
		return fleet.Diff{Workers: len(workers)}, false, true, nil
	}
	wasUnsure := r.unsure
	r.unsure = true // left so if Apply panics
	if diff, err = r.deps.Fleet.Apply(workers); err != nil {
		r.unsure = wasUnsure // a refused set changed nothing
		return fleet.Diff{}, false, false, fmt.Errorf("discovery: the fleet refused the worker set: %w", err)
	}
	first = !r.synced
	r.synced, r.applied, r.lastReject, r.unsure = true, slices.Clone(workers), "", false
	return diff, first, false, nil
}

// Reject implements Sink: the workers in force stay, and the log and
// kvroute_discovery_stale say why.
func (r *Runner) Reject(err error) {
	r.mu.Lock()
	kept, repeated := len(r.applied), r.lastReject == err.Error()
	r.lastReject = err.Error()
	r.mu.Unlock()
	r.deps.Metrics.rejected()
	if !repeated {
		r.deps.Logger.Error("discovery input rejected; the workers in force stay", "source", r.name, "workers", kept, "error", err)
	}
}

// equal compares worker sets, order included: sources report sets in a stable order.
func equal(a, b []router.Worker) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.DeepEqual(a, b))
}
