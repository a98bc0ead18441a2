package kvevents

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/router"
)

// Deps are what a Manager is built from. Index and BlockSize are required.
type Deps struct {
	Index Index
	// BlockSize is kvroute's block size (block_size): events must match it.
	BlockSize int
	// DefaultCapacity is the index's default capacity in blocks (index.capacity_blocks),
	// for workers that set none; it bounds each worker's engine-hash map.
	DefaultCapacity int
	// OffloadCapacity is index.offload_capacity_blocks (0: index.DefaultOffloadFactor
	// times the worker's capacity): it sizes the bound of each worker's offload-tier
	// engine hashes (and, with a held tier beyond the device, the held bound's share).
	OffloadCapacity int
	// Registerer, when set, gets the kvroute_kvevents_* series.
	Registerer prometheus.Registerer
	// Panics counts the messages whose handling panicked (loop "kv_events"); nil
	// counts nothing.
	Panics *background.Metrics
	Logger *slog.Logger
	// Now is the clock of the silence rule and the event lag; nil means time.Now.
	Now func() time.Time
	// ApproxTokenizer reports whether a model is tokenized approximately: a real
	// engine's token ids never match approximate ones, so subscribing such a worker is
	// warned about. Nil: never.
	ApproxTokenizer func(model string) bool
}

// Manager subscribes to the KV events of every worker that has `kv_events`, following
// the fleet ([Manager.SetWorkers]): a worker added by a reload or by discovery gets
// its subscriptions, a removed one's stop (before the index forgets it), a changed
// one's are remade. [Manager.Run] runs them and the silence watchdog.
type Manager struct {
	cfg     Config
	deps    Deps
	metrics *Metrics
	log     *slog.Logger

	mu      sync.Mutex
	ctx     context.Context // Run's; nil before Run and after it returns
	workers map[string]*subscription
}

// subscription is one worker's subscribers (one per rank) and applier.
type subscription struct {
	worker  router.Worker
	applier *Applier
	subs    []*subscriber
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

// New returns a Manager with no workers.
func New(cfg Config, deps Deps) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Index == nil || deps.BlockSize <= 0 {
		return nil, errors.New("kvevents: Index and BlockSize are required")
	}
	if deps.DefaultCapacity <= 0 {
		deps.DefaultCapacity = index.DefaultConfig().CapacityBlocks
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg, deps: deps, metrics: NewMetrics(deps.Registerer), log: deps.Logger, workers: map[string]*subscription{}}
	if deps.Registerer != nil {
		deps.Registerer.MustRegister(newWorkerCollector(m))
	}
	return m, nil
}

// SetWorkers makes the subscriptions follow the fleet. Workers without kv_events are
// not subscribed. It returns once removed workers' subscribers have stopped, so the
// index may forget them next.
func (m *Manager) SetWorkers(workers []router.Worker) {
	stop, start, removed, ctx := m.follow(workers)
	for _, sub := range stop { // every one, before anything that may panic
		sub.stop()
	}
	for _, sub := range stop {
		// Its confirmed entries came from a stream no longer followed.
		_ = m.deps.Index.SetMode(sub.worker.Name, index.ModeApproximate)
	}
	for _, name := range removed { // after its subscriber stopped counting
		m.metrics.forget(name)
	}
	if ctx == nil {
		return // Run starts them
	}
	// Started under the lock, and only while Run has not begun shutting down (it
	// collects the subscriptions to stop under the lock) and the subscription is still
	// the worker's (a later call may have replaced it meanwhile).
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ctx != ctx {
		return
	}
	for _, sub := range start {
		if m.workers[sub.worker.Name] == sub {
			sub.start(ctx)
		}
	}
}

// follow makes the subscriptions of workers the Manager's, and returns those to stop
// and those to start, the workers removed, and Run's context (nil before Run). The new
// subscriptions are all made before any is put in place: one whose making panics (a
// bug a discovered worker's kv_events reach, which a discovery source's guard
// recovers above the fleet) leaves the Manager's as they were, running, for the retry
// to change; put in place one by one, those already replaced were dropped unstopped
// and their replacements, never started, taken for the ones in force by the retry.
func (m *Manager) follow(workers []router.Worker) (stop, start []*subscription, removed []string, ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	type resize struct {
		sub             *subscription
		capacity        int
		held, offloaded int
	}
	var resized []resize
	keep := map[string]bool{}
	for _, w := range workers {
		if w.KVEvents == nil {
			continue
		}
		keep[w.Name] = true
		old, ok := m.workers[w.Name]
		if ok && reflect.DeepEqual(old.worker, w) {
			continue
		}
		if ok && old.applier != nil && sameButCapacity(old.worker, w) {
			// A capacity read from the engine after the subscription began: resize the
			// engine-hash map's bound in place rather than drop the stream's state.
			held, offloaded := m.maxEntries(w)
			resized = append(resized, resize{sub: old, capacity: w.CapacityBlocks, held: held, offloaded: offloaded})
			continue
		}
		start = append(start, m.newSubscription(w))
	}
	// In place from here on: nothing below processes what the workers say.
	for _, r := range resized {
		r.sub.worker.CapacityBlocks = r.capacity
		r.sub.applier.SetMaxEntries(r.held, r.offloaded)
	}
	for _, sub := range start {
		if old, ok := m.workers[sub.worker.Name]; ok {
			stop = append(stop, old)
		}
		m.workers[sub.worker.Name] = sub
	}
	for name, sub := range m.workers {
		if !keep[name] {
			stop = append(stop, sub)
			delete(m.workers, name)
			removed = append(removed, name)
		}
	}
	return stop, start, removed, m.ctx
}

func (m *Manager) newSubscription(w router.Worker) *subscription {
	log := m.log.With("worker", w.Name)
	model := w.EventModel()
	if m.deps.ApproxTokenizer != nil && m.deps.ApproxTokenizer(model) {
		log.Warn("kv events: the approximate tokenizer is configured for this worker's model; a real engine's token ids will never match its ids, so its events cannot predict any overlap (configure the model's exact tokenizer)", "model", model)
	}
	streams, err := w.KVEvents.Resolve(w.Address)
	if err != nil { // validated with the config; a discovered worker may still be odd
		log.Error("kv events: cannot resolve the worker's endpoints", "error", err)
		return &subscription{worker: w}
	}
	held, offloaded := m.maxEntries(w)
	spec := WorkerSpec{Name: w.Name, Model: model, BlockSize: m.deps.BlockSize, Ranks: len(streams.Endpoints), MaxEntries: held, MaxOffloaded: offloaded,
		OffloadBlockSize: w.KVEvents.OffloadBlockSize, FirstRank: w.KVEvents.FirstRank}
	sub := &subscription{worker: w, applier: NewApplier(spec, m.cfg, m.deps.Index, m.metrics, log)}
	zmqLog := discardLogger()
	for r, ep := range streams.Endpoints {
		st := &stream{a: sub.applier, rank: r, now: m.deps.Now, metrics: m.metrics, log: log}
		if streams.Replay != nil {
			st.replay = newReplayer(streams.Replay[r], m.cfg.ReplayTimeout, zmqLog)
		}
		sub.subs = append(sub.subs, &subscriber{stream: st, guard: background.NewGuard(background.LoopKVEvents, log, m.deps.Panics),
			endpoint: ep, bind: streams.Bind, topic: streams.Topic,
			backoff: m.cfg.ReconnectBackoffMax, maxConns: m.cfg.MaxBindConnections,
			displaceAfter: m.cfg.BindIdleDisplaceAfter, now: m.deps.Now, log: log, zmqLog: zmqLog})
	}
	return sub
}

// maxEntries bounds a worker's engine-hash maps: for the held tiers twice its capacity
// (its configured or scraped capacity_blocks, else the default), room for every block
// stored while the removals of as many are still in flight, and for the offload tiers
// twice their bound in the index (index.offload_capacity_blocks). A held tier beyond
// the device (tiers: [device, host]) adds the host's to the first.
func (m *Manager) maxEntries(w router.Worker) (held, offloaded int) {
	capacity := w.CapacityBlocks
	if capacity == 0 {
		capacity = m.deps.DefaultCapacity
	}
	host := 2 * index.Config{OffloadCapacityBlocks: m.deps.OffloadCapacity}.OffloadCapacity(capacity)
	held = 2 * capacity
	if slices.ContainsFunc(m.cfg.Tiers, func(t string) bool { return t != "device" }) {
		held += host
	}
	return held, host
}

// sameButCapacity reports whether a and b differ at most in CapacityBlocks.
func sameButCapacity(a, b router.Worker) bool {
	a.CapacityBlocks = b.CapacityBlocks
	return reflect.DeepEqual(a, b)
}

func (s *subscription) start(ctx context.Context) {
	ctx, s.cancel = context.WithCancel(ctx)
	for _, sub := range s.subs {
		s.done.Go(func() { sub.run(ctx) })
	}
}

func (s *subscription) stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.done.Wait()
}

// Run starts the subscriptions and the silence watchdog, and stops them when ctx ends.
func (m *Manager) Run(ctx context.Context) {
	m.mu.Lock()
	m.ctx = ctx
	for _, sub := range m.workers {
		sub.start(ctx)
	}
	m.mu.Unlock()

	tick := time.NewTicker(min(m.cfg.SilenceTimeout/4, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			m.mu.Lock()
			m.ctx = nil
			subs := make([]*subscription, 0, len(m.workers))
			for _, sub := range m.workers {
				subs = append(subs, sub)
			}
			m.mu.Unlock()
			for _, sub := range subs {
				sub.stop()
			}
			return
		case <-tick.C:
			m.CheckSilence()
		}
	}
}

// CheckSilence puts back in approximate mode every event-mode worker whose stream has
// been broken (no connection) or silent (routed blocks unreported) for
// silence_timeout: its reported entries are cleared, since the events that would
// report their eviction are not arriving, and its decisions count for index.ttl
// again. The worker returns to event mode at its next batch. Run calls it
// periodically.
func (m *Manager) CheckSilence() {
	now := m.deps.Now()
	m.mu.Lock()
	subs := make([]*subscription, 0, len(m.workers))
	for _, sub := range m.workers {
		subs = append(subs, sub)
	}
	m.mu.Unlock()
	for _, sub := range subs {
		name := sub.worker.Name
		if sub.applier == nil || m.deps.Index.Mode(name) != index.ModeEvents {
			continue
		}
		why := ""
		if since, owed := m.deps.Index.Awaiting(name); owed && now.Sub(since) >= m.cfg.SilenceTimeout {
			why = "silent: routed blocks were not reported"
		}
		for _, s := range sub.subs {
			if since, down := s.downSince(); down && now.Sub(since) >= m.cfg.SilenceTimeout {
				why = "broken: not connected to the publisher"
			}
		}
		if why == "" {
			continue
		}
		m.log.Warn("kv events: worker back in approximate mode until its events resume", "worker", name, "why", why, "after", m.cfg.SilenceTimeout)
		sub.applier.Silence(reasonSilence)
	}
}

// workerStatus is one subscribed worker's state, for the metrics.
type workerStatus struct {
	name, mode string
	blocks     int
	offloaded  int // offload-tier blocks the index holds
}

func (m *Manager) snapshot() []workerStatus {
	m.mu.Lock()
	names := make([]string, 0, len(m.workers))
	for name := range m.workers {
		names = append(names, name)
	}
	m.mu.Unlock()
	slices.Sort(names)
	out := make([]workerStatus, len(names))
	for i, name := range names {
		out[i] = workerStatus{name: name, mode: m.deps.Index.Mode(name).String(), blocks: m.deps.Index.ConfirmedEntries(name),
			offloaded: m.deps.Index.OffloadedEntries(name)}
	}
	return out
}
