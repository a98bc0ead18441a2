package replay

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize"
)

// Index sources.
const (
	SourceApproximate = "approximate" // the router records its own decisions
	SourceEvents      = "events"      // the engines' KV events feed the index
)

// Config is one replay run.
type Config struct {
	Workers int
	Engine  sim.Config
	// Policy is a NewPicker spec.
	Policy string
	Seed   uint64
	// IndexSource is SourceApproximate or SourceEvents.
	IndexSource string
	// IndexTTL is the approximate index's TTL (virtual time); 0 keeps blocks until evicted.
	IndexTTL time.Duration
	// ApproximateOffload, with the approximate source, keeps the decisions' blocks the
	// workers' capacity evicts as offloaded (index.Config.ApproximateOffload): the
	// router guesses the engines' host tiers (Engine.HostBlocks) without KV events.
	ApproximateOffload bool
	// KVEvents is how the events source reads the engines' events (which tiers count
	// as held, which as offloaded); nil means kvevents.DefaultConfig. With
	// Engine.HostBlocks the simulated engines report their host tier as "CPU".
	KVEvents *kvevents.Config
	// PendingTTL is how long, with the events source, a decision's blocks count on the
	// chosen worker before the engine reports them (virtual time); 0 means
	// DefaultPendingTTL.
	PendingTTL time.Duration
	// Model salts the block hashes.
	Model string
	// LoRAAdapters are the adapters of Model that requests may name (Req.LoRA): the
	// router's lora_adapters.
	LoRAAdapters []string
	// SessionHeader sends each session request's session id to the router, as the
	// session header does (session affinity, policy session_affinity_weight).
	SessionHeader bool
	// HideMaxNumSeqs leaves the workers' max_num_seqs out of the router's config (as
	// when an operator does not set workers[].max_num_seqs): the router then sees batch
	// pressure only through its own bookings.
	HideMaxNumSeqs bool
	// Replicas is the number of kvroute replicas routing the workload (0 means 1). Each
	// has its own bookings, session memory and index, as separate processes do; each
	// request goes to one drawn at random (seeded), as Envoy balances ext_proc streams
	// over a cluster. With the events source every replica's index hears every engine's
	// events; with the approximate source a replica knows only its own decisions.
	Replicas int
	// SharedBookings gives every replica one ledger of bookings, as if replicas told
	// each other at once what they booked: the upper bound of what sharing bookings
	// between replicas could buy (kvroute does not share them).
	SharedBookings bool
	// ShareInterval, with several replicas, has each replica tell the others every
	// ShareInterval what it has booked on each worker (scoring.Bookings.SetPeerLoad) and
	// its prefill history there (SetPeerHistory): a decision sees its own bookings now
	// and the others' as of the last exchange (their histories decayed since). 0
	// exchanges nothing. It excludes SharedBookings.
	ShareInterval time.Duration
	// ShareBlocks makes each exchange (ShareInterval) carry the blocks each replica's
	// decisions stored in its index since the last one, which the others store too,
	// as package peers does with peers.share_blocks.
	ShareBlocks bool
	// ScrapeInterval is how often the engines' own signals (queue length and KV usage,
	// router.Signals, and the LoRA adapters they run and queue, router.EngineAdapters)
	// are sampled, as kvroute scrapes /metrics (engine_metrics.interval): a decision sees
	// the last sample. 0 samples at every decision (no staleness).
	ScrapeInterval time.Duration
	// BypassShare is the share of sessions (of requests, without sessions) that reach
	// the workers past kvroute, round-robin, as clients calling pods directly or a
	// second gateway would: the engines run them, kvroute books and records nothing of
	// them (with KV events its index still hears their blocks). Their requests are
	// left out of the results, which are the routed requests'. Chosen by a hash of the
	// session (or request) id, so every policy faces the same ones.
	BypassShare float64
	// NoEngineAdapters leaves the engines' running and waiting LoRA adapters out of the
	// router's view (router.Deps.EngineAdapters), as kvroute before 2026-12-05: the
	// cost then sees only the adapters its replica (and its peers) booked.
	NoEngineAdapters bool
	// PrefillWorkers adds this many prefill workers (role prefill) beside the Workers,
	// which are then decode workers: disaggregated prefill and decode. A request the
	// router splits is prefilled on its prefill worker (one output token), its KV sent
	// to the decode worker in sim.TransferTime of the tokens that worker lacks, and
	// decoded there; its time to first token is the decode worker's. 0: aggregated.
	PrefillWorkers int
	// UnseenRequests plays engine_metrics.unseen_requests (on in the server): at each
	// scrape (ScrapeInterval; without one, at each decision) every replica's ledger
	// learns each engine's running and waiting requests, and counts those beyond its
	// own and its peers' bookings in N(w) (scoring.Bookings.SetEngineRequests). Off
	// here by default so that the recorded tables stay as measured; with one replica
	// and nothing bypassing kvroute it changes nothing (the counts agree).
	UnseenRequests bool
	// MaxActive is the routers' max_active_requests_per_worker (0: no limit), with flow
	// control on: a request no worker can take is held, first come first served (one
	// priority, one flow), and routed as soon as a request ends and one can; its TTFT
	// counts from its arrival. One replica, no prefill workers.
	MaxActive int
	// HolderWait plays flow_control.holder_wait with MaxActive: a request whose
	// holder (the full worker holding more than half of its prompt beyond every other
	// worker and a hot shared prefix: router.HolderBusyError) is at the limit waits
	// in that worker's queue, for at most HolderWait from its arrival, before any
	// worker may take it. As a request ends, the queues' heads are tried oldest first,
	// as the server's dispatcher does. 0: every held request takes the first worker
	// that can take it.
	HolderWait time.Duration
	// HoldOnSaturation plays flow_control.hold_on_saturation: a request is held (first
	// come first served, with MaxActive's held requests) while every engine is saturated
	// by the priority section's default rule (more than 5 waiting, or more than 80 % of
	// its KV cache in use), read as Signals reads them (at the last scrape with
	// ScrapeInterval), and routed as a pass ends and one is not. One replica, no prefill
	// workers.
	HoldOnSaturation bool
	// DPRanks makes each of the Workers a server of DPRanks data-parallel ranks behind
	// one address (vLLM --data-parallel-size), each rank a simulated engine of Engine:
	// Engine describes one rank. 0 or 1: one engine per worker, as before. Without
	// DPRankRouting the router sees Workers servers (blind): each with DPRanks× a
	// rank's KV capacity and max_num_seqs, its index holding the union of its ranks'
	// blocks, its engine signals its ranks' sums (queue, requests) and mean (KV usage);
	// a request routed (or bypassing) to a server goes to the rank its balancer picks
	// ([pickRank]). Results count ranks as workers (moved turns, prefill balance).
	// Without prefill workers, LoRA adapters or a request log.
	DPRanks int
	// DPRankRouting routes to ranks: the router sees Workers×DPRanks workers, each
	// rank a worker of its own, as a rank header would let it.
	DPRankRouting bool
	// Log, when set, receives the run's request log: one JSON line per finished
	// request, engine pass and run of evicted blocks (see RequestLine, PassLine and
	// EvictLine). Run reports an error writing it.
	Log io.Writer
}

// DefaultPendingTTL is the events source's default pending TTL: a few passes of a busy
// engine, enough for a queued prompt to be computed and reported.
const DefaultPendingTTL = 2 * time.Second

// epoch anchors virtual time for components that take a wall clock.
var epoch = time.Unix(1_700_000_000, 0)

// run is the state of one replay.
type run struct {
	cfg      Config
	workload Workload
	replicas []*replica
	pickRNG  *rand.Rand // which replica routes a request; nil with one replica
	scraped  []signal   // the engines' last sampled signals (ScrapeInterval > 0)
	// adapterMemory remembers each engine's reported LoRA adapters for the residency,
	// as enginemetrics.Scraper does.
	adapterMemory []enginemetrics.AdapterMemory
	nextScrape    time.Duration
	scrapeWake    time.Duration // the scrape a dispatchHeld event is queued for (HoldOnSaturation); 0: none
	nextBypass    int           // the worker the next request past kvroute goes to (BypassShare)
	nextShare     time.Duration
	failed        error         // an event batch the consumer refused: a bug, reported by Run
	engines       []*sim.Engine // ranks engines per worker, worker i's from i*ranks
	ranks         int           // engines per worker (Config.DPRanks without DPRankRouting); 0 means 1
	names         []string      // the router's workers
	byName        map[string]int
	now           time.Duration
	events        eventQueue
	seq           int
	inflight      map[*sim.Request]*flight
	held          []heldRequest // requests every worker refused (MaxActive), in arrival order
	// waitingFor are the requests waiting for their holder (HolderWait), by worker
	// index, each in arrival order.
	waitingFor [][]heldRequest
	records    []record
	log        *logger // nil without Config.Log
}

// replica is one kvroute process: its router and bookings and, with the events source,
// one event consumer per worker feeding its own event index.
type replica struct {
	router   *router.Router
	bookings *scoring.Bookings   // kept to check, at the end, that every booking came back
	appliers []*kvevents.Applier // events source only
	index    router.BlockIndex   // where the other replicas' records go (ShareBlocks)
	sessions *session.Store      // and their sessions
	records  *recordLog          // its decisions' records since the last exchange (ShareBlocks)
}

// recordLog collects a replica's decisions' records between two exchanges: the
// replay's peers.Records.
type recordLog struct{ records []blockRecord }

// blockRecord is one decision's blocks on its worker, and its session ("" without).
type blockRecord struct {
	worker  string
	blocks  []uint64
	session string
}

// Recorded keeps the decision's blocks (router.RecordSink: the router's hashes are
// fresh for each decision and never changed, as peers.Records relies on too).
func (l *recordLog) Recorded(worker, _ string, blocks []uint64, session string) {
	l.records = append(l.records, blockRecord{worker: worker, blocks: blocks, session: session})
}

// signal is what an engine's /metrics page says at a scrape.
type signal struct {
	waiting  int
	kvUsage  float64
	adapters []string // running and waiting LoRA adapters
}

type flight struct {
	req      *Req
	decision *router.Decision
	arrival  time.Duration
	held     time.Duration // how long flow control held it before it was routed
	worker   int
	first    time.Duration
	prev     int // the session's previous worker, for the log
	// decode, for a split request in its prefill stage, is the request its decode
	// worker runs once the prefill worker is done and the KV has arrived.
	decode *sim.Request
	// prefilled are the prompt tokens the prefill worker computed, and transferred the
	// ones the decode worker loaded (split requests).
	prefilled, transferred int
}

// record is one finished request.
type record struct {
	req        *Req
	worker     int
	arrival    time.Duration
	ttft, e2e  time.Duration
	prompt     int
	split      bool // prefilled on a prefill worker
	transfer   int  // tokens loaded by the decode worker
	predicted  int  // cached tokens the decision predicted
	cached     int  // cached tokens the engine served at admission
	host       int  // tokens the engine loaded from its host tier at admission
	recomputed int
	held       time.Duration // held by flow control before routing (MaxActive)
	preempted  int
	blocksLost int
}

// Run replays a workload and returns its measurements.
func Run(cfg Config, w Workload) (Result, error) {
	if cfg.Workers <= 0 {
		return Result{}, fmt.Errorf("workers: must be > 0, got %d", cfg.Workers)
	}
	if cfg.IndexSource != SourceApproximate && cfg.IndexSource != SourceEvents {
		return Result{}, fmt.Errorf("index source: must be %s or %s, got %q", SourceApproximate, SourceEvents, cfg.IndexSource)
	}
	if cfg.Replicas < 0 {
		return Result{}, fmt.Errorf("replicas: must be ≥ 0, got %d", cfg.Replicas)
	}
	if cfg.ApproximateOffload && cfg.IndexSource != SourceApproximate {
		return Result{}, fmt.Errorf("approximate offload: needs the %s index source (with %s the engines report their host tiers)", SourceApproximate, SourceEvents)
	}
	if cfg.ApproximateOffload && cfg.Engine.HostBlocks == 0 {
		return Result{}, fmt.Errorf("approximate offload: needs engines with a host tier (host blocks > 0): it credits blocks they would hold there")
	}
	if cfg.KVEvents != nil {
		if err := cfg.KVEvents.Validate(); err != nil {
			return Result{}, err
		}
	}
	if cfg.ScrapeInterval < 0 {
		return Result{}, fmt.Errorf("scrape interval: must be ≥ 0, got %s", cfg.ScrapeInterval)
	}
	if !(cfg.BypassShare >= 0 && cfg.BypassShare < 1) {
		return Result{}, fmt.Errorf("bypass share: must be in [0, 1), got %v", cfg.BypassShare)
	}
	if cfg.ShareInterval < 0 {
		return Result{}, fmt.Errorf("share interval: must be ≥ 0, got %s", cfg.ShareInterval)
	}
	if cfg.ShareInterval > 0 && cfg.SharedBookings {
		return Result{}, fmt.Errorf("share interval: replicas with one shared ledger have nothing to exchange")
	}
	replicas := max(cfg.Replicas, 1)
	if cfg.ShareBlocks && cfg.ShareInterval == 0 {
		return Result{}, fmt.Errorf("share blocks: needs a share interval")
	}
	if replicas < 2 && (cfg.SharedBookings || cfg.ShareInterval > 0) {
		return Result{}, fmt.Errorf("shared bookings and share interval: need at least 2 replicas, got %d", replicas)
	}
	if cfg.PrefillWorkers < 0 {
		return Result{}, fmt.Errorf("prefill workers: must be ≥ 0, got %d", cfg.PrefillWorkers)
	}
	if cfg.PrefillWorkers > 0 && cfg.Log != nil {
		return Result{}, fmt.Errorf("request log: not written with prefill workers")
	}
	if cfg.MaxActive < 0 {
		return Result{}, fmt.Errorf("max active: must be ≥ 0, got %d", cfg.MaxActive)
	}
	if cfg.MaxActive > 0 && (replicas > 1 || cfg.PrefillWorkers > 0) {
		return Result{}, fmt.Errorf("max active: plays one replica's flow control, without prefill workers")
	}
	if cfg.HoldOnSaturation && (replicas > 1 || cfg.PrefillWorkers > 0) {
		return Result{}, fmt.Errorf("hold on saturation: plays one replica's flow control, without prefill workers")
	}
	if cfg.HolderWait < 0 || (cfg.HolderWait > 0 && cfg.MaxActive == 0) {
		return Result{}, fmt.Errorf("holder wait: must be ≥ 0, and plays flow control with a max active limit, got %v with max active %d", cfg.HolderWait, cfg.MaxActive)
	}
	if replicas > 1 && strings.HasPrefix(cfg.Policy, "partition") {
		// The oracle numbers new prefixes in the order one picker sees them.
		return Result{}, fmt.Errorf("policy %q: a partition needs one replica", cfg.Policy)
	}
	if cfg.DPRanks < 0 {
		return Result{}, fmt.Errorf("dp ranks: must be ≥ 0, got %d", cfg.DPRanks)
	}
	ranks := max(cfg.DPRanks, 1)
	if cfg.DPRankRouting {
		cfg.Workers, ranks = cfg.Workers*ranks, 1 // every rank a worker
	}
	if ranks > 1 && (cfg.PrefillWorkers > 0 || len(cfg.LoRAAdapters) > 0 || cfg.Log != nil) {
		return Result{}, fmt.Errorf("dp ranks: servers of ranks routed blind are played without prefill workers, LoRA adapters or a request log")
	}
	rn := &run{cfg: cfg, workload: w, byName: map[string]int{}, inflight: map[*sim.Request]*flight{}, ranks: ranks,
		log: newLogger(cfg.Log, cfg.Engine, index.Salt(cfg.Model, "", ""), cfg.Workers)}
	var workers []router.Worker
	for i := range cfg.Workers + cfg.PrefillWorkers {
		for range ranks {
			e, err := sim.New(cfg.Engine)
			if err != nil {
				return Result{}, err
			}
			rn.engines = append(rn.engines, e)
		}
		name, role := fmt.Sprintf("w%d", i), ""
		if i >= cfg.Workers {
			name, role = fmt.Sprintf("p%d", i-cfg.Workers), router.RolePrefill
		}
		rn.names = append(rn.names, name)
		rn.byName[name] = i
		// A server of ranks is configured as their union.
		w := router.Worker{Name: name, Address: fmt.Sprintf("127.0.0.1:%d", 20000+i), MaxNumSeqs: ranks * cfg.Engine.MaxNumSeqs, MaxLoRAs: ranks * cfg.Engine.MaxLoRAs, Role: role}
		if cfg.HideMaxNumSeqs {
			w.MaxNumSeqs = 0
		}
		workers = append(workers, w)
	}
	if cfg.ScrapeInterval > 0 {
		rn.scraped = make([]signal, len(rn.engines))
	}
	var shared *scoring.Bookings
	if cfg.SharedBookings {
		shared = scoring.NewBookingsResident(router.DefaultLoRAResidency, func() time.Time { return epoch.Add(rn.now) })
	}
	for r := range replicas {
		// Replica 0 draws ties from the stream one router always drew from, so a
		// one-replica run is the run it was before replicas existed.
		rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15+uint64(r)))
		bookings := shared
		if bookings == nil {
			bookings = scoring.NewBookingsResident(router.DefaultLoRAResidency, func() time.Time { return epoch.Add(rn.now) })
		}
		rep, err := rn.newReplica(workers, bookings, rng)
		if err != nil {
			return Result{}, err
		}
		rn.replicas = append(rn.replicas, rep)
	}
	if replicas > 1 {
		rn.pickRNG = rand.New(rand.NewPCG(cfg.Seed, 0x7265706c69636173))
	}
	for _, a := range w.Start() {
		rn.push(event{at: a.At, arrival: a.Req})
	}
	for rn.events.Len() > 0 && rn.failed == nil {
		ev := heap.Pop(&rn.events).(event)
		rn.scrapeUntil(ev.at)
		rn.shareUntil(ev.at)
		rn.now = ev.at
		if ev.arrival != nil {
			if err := rn.arrive(ev.arrival); err != nil {
				return Result{}, err
			}
		} else if ev.transfer != nil {
			if err := rn.engines[ev.engine].Add(ev.transfer); err != nil {
				return Result{}, err
			}
		} else if ev.engine < 0 {
			// A held request's wait for its holder ends, or a scrape may end a saturation.
			if err := rn.dispatchHeld(); err != nil {
				return Result{}, err
			}
		} else {
			rn.endPass(ev.engine)
		}
		// Passes start once every event of this instant is in, so requests that
		// arrive together (or as a pass ends) join the pass that starts then, whatever
		// order their events were queued in.
		if rn.events.Len() == 0 || rn.events[0].at > rn.now {
			rn.startPasses()
		}
	}
	if rn.failed != nil {
		return Result{}, rn.failed
	}
	if held := rn.heldCount(); len(rn.inflight) > 0 || held > 0 {
		return Result{}, fmt.Errorf("replay ended with %d requests in flight and %d held", len(rn.inflight), held)
	}
	if err := rn.checkReleased(); err != nil {
		return Result{}, err
	}
	if rn.log != nil && rn.log.err != nil {
		return Result{}, fmt.Errorf("request log: %w", rn.log.err)
	}
	return rn.result(), nil
}

// newReplica builds one kvroute on a ledger of bookings: its index, its event consumers
// (events source), its session memory and picker, and its router.
func (rn *run) newReplica(workers []router.Worker, bookings *scoring.Bookings, rng *rand.Rand) (*replica, error) {
	cfg := rn.cfg
	clock := func() time.Time { return epoch.Add(rn.now) }
	rep := &replica{bookings: bookings}
	// The router records every decision in its index: the approximate index keeps it
	// until capacity or the TTL forgets it; the event index holds it pending until the
	// engine's events confirm it.
	var idx interface {
		router.BlockIndex
		SetWorker(name string, capacityBlocks int) error
	}
	var events *index.EventIndex // events source only
	eventsConfig := kvevents.DefaultConfig()
	if cfg.KVEvents != nil {
		eventsConfig = *cfg.KVEvents
	}
	// A worker's capacity is its ranks' (one engine's without data-parallel ranks).
	capacity, host := rn.rankCount()*cfg.Engine.NumGPUBlocks, rn.rankCount()*cfg.Engine.HostBlocks
	if cfg.IndexSource == SourceEvents {
		ttl := cfg.PendingTTL
		if ttl == 0 {
			ttl = DefaultPendingTTL
		}
		ev, err := index.NewEventIndex(index.Config{CapacityBlocks: capacity, PendingTTL: ttl,
			OffloadCapacityBlocks: host}, clock)
		if err != nil {
			return nil, err
		}
		events, idx = ev, ev
	} else if cfg.ApproximateOffload {
		// Every worker stays approximate (no events reach this index).
		approx, err := index.NewEventIndex(index.Config{CapacityBlocks: capacity, TTL: cfg.IndexTTL, PendingTTL: DefaultPendingTTL,
			OffloadCapacityBlocks: host, ApproximateOffload: true}, clock)
		if err != nil {
			return nil, err
		}
		idx = approx
	} else {
		approx, err := index.New(index.Config{CapacityBlocks: capacity, TTL: cfg.IndexTTL}, clock)
		if err != nil {
			return nil, err
		}
		idx = approx
	}
	for _, w := range workers {
		if err := idx.SetWorker(w.Name, capacity); err != nil {
			return nil, err
		}
		if events == nil {
			continue
		}
		if err := events.SetMode(w.Name, index.ModeEvents); err != nil {
			return nil, err
		}
		// The engine's events reach the index as a live worker's do: encoded in vLLM's
		// wire format (maps, or arrays on every other worker), decoded, and applied with
		// hashes recomputed from their token ids; a server's ranks are its streams.
		rep.appliers = append(rep.appliers, kvevents.NewApplier(kvevents.WorkerSpec{Name: w.Name, Model: cfg.Model,
			BlockSize: cfg.Engine.BlockSize, Ranks: rn.rankCount(), MaxEntries: 2 * (capacity + host), MaxOffloaded: 2 * max(host, 1)}, eventsConfig, events, nil, nil))
	}
	picker, policy, err := NewPolicyPicker(cfg.Policy, cfg.Engine.BlockSize, rng)
	if err != nil {
		return nil, err
	}
	var prefillPicker scoring.Picker
	if cfg.PrefillWorkers > 0 {
		// A picker of its own for the prefill pick, as the server builds one: a shared
		// round_robin would advance twice a decision. It prices with the same policy and
		// draws from the same stream as the destination's (in the same order as one
		// picker would).
		if prefillPicker, _, err = NewPolicyPicker(cfg.Policy, cfg.Engine.BlockSize, rng); err != nil {
			return nil, err
		}
	}
	sessions, err := session.New(session.DefaultConfig(), clock)
	if err != nil {
		return nil, err
	}
	adapters := make([]router.LoRAAdapter, len(cfg.LoRAAdapters))
	for i, name := range cfg.LoRAAdapters {
		adapters[i] = router.LoRAAdapter{Name: name, BaseModel: cfg.Model}
	}
	deps := router.Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: rep.bookings,
		Picker: picker, PrefillPicker: prefillPicker, RecordBlocks: true, Signals: rn, LoRAStates: rn, Now: clock, Sessions: sessions, Policy: policy,
	}
	if !cfg.NoEngineAdapters {
		deps.EngineAdapters = rn
	}
	if cfg.HoldOnSaturation {
		deps.Saturation, deps.EngineLoad = priority.DefaultConfig().Saturation(), rn
	}
	rep.index, rep.sessions = idx, sessions
	if cfg.ShareBlocks {
		rep.records = &recordLog{}
		deps.Records = rep.records
	}
	rep.router, err = router.New(router.Config{BlockSize: cfg.Engine.BlockSize, Workers: workers, LoRAAdapters: adapters, MaxActiveRequestsPerWorker: cfg.MaxActive}, deps)
	if err != nil {
		return nil, err
	}
	return rep, nil
}

// shareRecords gives each replica the records the others' decisions made since the
// last exchange (ShareBlocks), stored in its index as package peers stores them.
func (rn *run) shareRecords() {
	for r, rep := range rn.replicas {
		if rep.records == nil {
			return
		}
		for _, rec := range rep.records.records {
			for o, other := range rn.replicas {
				if o != r {
					_ = other.index.Store(rec.worker, rec.blocks) // every replica has every worker
					if rec.session != "" {
						other.sessions.Remember(rec.session, rec.worker)
					}
				}
			}
		}
		rep.records.records = rep.records.records[:0]
	}
}

// checkReleased reports a booking still held when every request has finished: a
// release that reached another replica's ledger, or none, would skew every later
// decision's load and go unseen in the results.
func (rn *run) checkReleased() error {
	for r, rep := range rn.replicas {
		for _, name := range rn.names {
			if l := rep.bookings.Load(name); l != (scoring.Load{}) {
				return fmt.Errorf("replica %d: worker %s still has bookings after the run: %+v", r, name, l)
			}
		}
	}
	return nil
}

// Signals reports a simulated engine's queue and KV usage, as its /metrics would: at
// the last scrape, or now without a scrape interval.
func (rn *run) Signals(worker string) (int, float64) {
	// A server of ranks: its ranks' queues summed, their KV usage averaged (the
	// share of the union in use: the ranks are alike).
	waiting, kv := 0, 0.0
	for ei := range rn.rankEngines(rn.byName[worker]) {
		if rn.scraped != nil {
			waiting, kv = waiting+rn.scraped[ei].waiting, kv+rn.scraped[ei].kvUsage
		} else {
			waiting, kv = waiting+rn.engines[ei].Waiting(), kv+rn.engines[ei].KVUsage()
		}
	}
	return waiting, kv / float64(rn.rankCount())
}

// rankCount is the engines per worker.
func (rn *run) rankCount() int { return max(rn.ranks, 1) }

// rankEngines yields the indexes in rn.engines of worker wi's ranks (its one engine
// without data-parallel ranks).
func (rn *run) rankEngines(wi int) func(func(int) bool) {
	return func(yield func(int) bool) {
		for ei := wi * rn.rankCount(); ei < (wi+1)*rn.rankCount(); ei++ {
			if !yield(ei) {
				return
			}
		}
	}
}

// pickRank is the engine of worker wi that a request sent to its address runs on: its
// one engine, or for a server of data-parallel ranks the rank vLLM's internal balancer
// (DPLBAsyncMPClient) picks, blind to the prompt: the fewest waiting plus running
// requests, ties to the lowest rank. It counts the requests sent to a rank at once, as
// the balancer counts its own assignments between the engines' reports.
func (rn *run) pickRank(wi int) int {
	best, least := -1, 0
	for ei := range rn.rankEngines(wi) {
		if n := rn.engines[ei].Waiting() + rn.engines[ei].Running(); best < 0 || n < least {
			best, least = ei, n
		}
	}
	return best
}

// EngineLoad implements router.EngineLoad for HoldOnSaturation: Signals, always read.
func (rn *run) EngineLoad(worker string) (int, float64, time.Duration, bool) {
	waiting, kv := rn.Signals(worker)
	return waiting, kv, 0, true
}

// EngineAdapters implements router.EngineAdapters: the LoRA adapters a simulated engine
// runs and queues, as its /metrics would say them: at the last scrape, or now without a
// scrape interval.
func (rn *run) EngineAdapters(worker string) []string {
	wi := rn.byName[worker] * rn.rankCount() // its first rank: ranks are played without LoRA adapters
	if rn.scraped != nil {
		return rn.scraped[wi].adapters
	}
	return rn.engineAdapters(wi)
}

// engineAdapters reads engine i's running and waiting adapters now, as enginemetrics
// reads them from vllm:lora_requests_info, with those it ran within the residency.
func (rn *run) engineAdapters(i int) []string {
	running, waiting := rn.engines[i].Adapters()
	if rn.adapterMemory == nil {
		rn.adapterMemory = make([]enginemetrics.AdapterMemory, len(rn.engines))
	}
	info := enginemetrics.LoRAInfo{Running: running, Waiting: waiting}
	return rn.adapterMemory[i].Observe(info.Adapters(), epoch.Add(rn.now), router.DefaultLoRAResidency)
}

// LoRAState implements router.LoRAStates from the simulated engine, read at the
// decision (no scrape delay): the GIE baseline's view of the engine's adapters.
func (rn *run) LoRAState(worker, adapter string) scoring.LoRAState {
	running, waiting := rn.engines[rn.byName[worker]*rn.rankCount()].Adapters() // ranks: no LoRA
	return enginemetrics.LoRAInfo{MaxLoRAs: rn.cfg.Engine.MaxLoRAs, Running: running, Waiting: waiting}.State(adapter)
}

// scrapeUntil takes the scrapes due before the event at t. The engines' state is
// constant between events, so a scrape taken here reads what it would have read at its
// own time, and of the scrapes due since the last event only the latest counts: it is
// taken once, so a short interval over a long idle gap costs one reading, not one per
// interval.
func (rn *run) scrapeUntil(t time.Duration) {
	if rn.scraped == nil || !takeDue(&rn.nextScrape, rn.cfg.ScrapeInterval, t) {
		return
	}
	rn.reportEngineRequests()
	for i, e := range rn.engines {
		rn.scraped[i] = signal{waiting: e.Waiting(), kvUsage: e.KVUsage()}
		if len(rn.cfg.LoRAAdapters) > 0 {
			rn.scraped[i].adapters = rn.engineAdapters(i)
		}
	}
}

// reportEngineRequests tells every replica's ledger what each engine runs and queues
// now (UnseenRequests), as engine_metrics' scrape does.
func (rn *run) reportEngineRequests() {
	if !rn.cfg.UnseenRequests {
		return
	}
	for wi, name := range rn.names {
		n := 0
		for ei := range rn.rankEngines(wi) {
			n += rn.engines[ei].Running() + rn.engines[ei].Waiting()
		}
		for _, rep := range rn.replicas {
			rep.bookings.SetEngineRequests(name, n)
		}
	}
}

// takeDue reports whether a periodic action (a scrape, an exchange) on the grid of
// interval from 0 is due at or before t, and if so moves next past t: only the latest
// one due is taken, as nothing changes between two events.
func takeDue(next *time.Duration, interval, t time.Duration) bool {
	if interval <= 0 || *next > t {
		return false
	}
	*next += (t-*next)/interval*interval + interval
	return true
}

// shareUntil makes the exchange of booked load between replicas due before the event at
// t (ShareInterval): each replica learns the others' summed P, N and W per worker,
// their prefill histories and their resident LoRA adapters.
// Bookings, like the engines, change only at events, so as for scrapes only the latest
// exchange due is made.
func (rn *run) shareUntil(t time.Duration) {
	if len(rn.replicas) < 2 || !takeDue(&rn.nextShare, rn.cfg.ShareInterval, t) {
		return
	}
	rn.shareRecords()
	// The prefill histories, as package peers sends them: each replica's own per
	// worker as of now, the others' summed.
	histories := make([]map[string]scoring.History, len(rn.replicas))
	for r, rep := range rn.replicas {
		histories[r] = rep.bookings.PrefillHistories()
	}
	for _, name := range rn.names {
		for r, rep := range rn.replicas {
			others := 0.0
			for o := range rn.replicas {
				if o != r {
					others += histories[o][name].After(0)
				}
			}
			rep.bookings.SetPeerHistory(name, others)
		}
	}
	for _, name := range rn.names {
		own := make([]scoring.Load, len(rn.replicas))
		var total scoring.Load
		for r, rep := range rn.replicas {
			own[r] = rep.bookings.Load(name)
			total.PrefillTokens += own[r].PrefillTokens
			total.ActiveRequests += own[r].ActiveRequests
			total.PendingRequests += own[r].PendingRequests
		}
		for r, rep := range rn.replicas {
			rep.bookings.SetPeerLoad(name, scoring.Load{ // the others' counts: D does not sum
				PrefillTokens:   total.PrefillTokens - own[r].PrefillTokens,
				ActiveRequests:  total.ActiveRequests - own[r].ActiveRequests,
				PendingRequests: total.PendingRequests - own[r].PendingRequests,
			})
		}
	}
	if len(rn.cfg.LoRAAdapters) == 0 {
		return
	}
	// The resident LoRA adapters, as package peers reports them: per worker, the
	// others' adapters with their requests summed.
	resident := make([]map[string]map[string]int, len(rn.replicas))
	for r, rep := range rn.replicas {
		_, resident[r] = rep.bookings.LoadsWithAdapters()
	}
	for _, name := range rn.names {
		for r, rep := range rn.replicas {
			var others map[string]int
			for o := range rn.replicas {
				if o == r {
					continue
				}
				for adapter, n := range resident[o][name] {
					if others == nil {
						others = map[string]int{}
					}
					others[adapter] += n
				}
			}
			rep.bookings.SetPeerAdapters(name, others)
		}
	}
}

// bypasses reports whether r reaches the workers past kvroute (Config.BypassShare).
func (rn *run) bypasses(r *Req) bool {
	if rn.cfg.BypassShare <= 0 {
		return false
	}
	id := uint64(r.ID)
	if r.Session >= 0 {
		id = uint64(r.Session)
	}
	// SplitMix64's finaliser: ids in order spread over [0, 1).
	id += 0x9e3779b97f4a7c15
	id = (id ^ id>>30) * 0xbf58476d1ce4e5b9
	id = (id ^ id>>27) * 0x94d049bb133111eb
	id ^= id >> 31
	return float64(id>>11)/(1<<53) < rn.cfg.BypassShare
}

// bypass runs r on the next worker round-robin, past every replica of kvroute.
func (rn *run) bypass(r *Req) error {
	wi := rn.pickRank(rn.nextBypass % rn.cfg.Workers)
	rn.nextBypass++
	sr := &sim.Request{ID: r.ID, Salt: index.Salt(rn.cfg.Model, r.LoRA, ""), LoRA: r.LoRA, Prompt: r.Prompt, Output: r.Output}
	if err := rn.engines[wi].Add(sr); err != nil {
		return err
	}
	rn.inflight[sr] = &flight{req: r, arrival: rn.now, worker: wi}
	return nil
}

func (rn *run) arrive(r *Req) error {
	if rn.bypasses(r) {
		return rn.bypass(r)
	}
	// An adapter request names the adapter as its model, as clients do.
	req := &router.Request{Model: rn.cfg.Model, Tokens: r.Prompt, Held: rn.cfg.HoldOnSaturation, HoldOnSaturation: rn.cfg.HoldOnSaturation}
	if r.LoRA != "" {
		req.Model = r.LoRA
	}
	if rn.cfg.SessionHeader && r.Session >= 0 {
		req.Session = strconv.Itoa(r.Session)
	}
	rep := rn.replicas[0]
	if rn.pickRNG != nil {
		rep = rn.replicas[rn.pickRNG.IntN(len(rn.replicas))]
	}
	if rn.scraped == nil { // no scrape interval: the engines read at each decision
		rn.reportEngineRequests()
	}
	if len(rn.held) > 0 {
		// Flow control: a newcomer waits behind the held requests (those waiting for
		// their holder are in their holder's queue, out of the way, as in the server).
		rn.held = append(rn.held, heldRequest{req: r, route: req, at: rn.now})
		return nil
	}
	d, err := rn.routeHeld(rep, heldRequest{req: r, route: req, at: rn.now})
	if err != nil || d == nil {
		return err
	}
	return rn.start(r, d, rn.now)
}

// heldRequest is a request flow control holds: its routing request and arrival.
type heldRequest struct {
	req   *Req
	route *router.Request
	at    time.Duration
	// woken: the end of its wait for its holder is an event already.
	woken bool
}

// routeHeld routes h through rep, as flow control's dispatcher does: it asks to wait for the
// request's holder until HolderWait has passed since its arrival. A request refused
// for capacity is held (nil decision and error): in its holder's queue when the
// router names one, in the general queue otherwise, each kept in arrival order.
func (rn *run) routeHeld(rep *replica, h heldRequest) (*router.Decision, error) {
	h.route.WaitForHolder = rn.waitsForHolder(h)
	d, err := rep.router.Route(context.Background(), h.route)
	var busy *router.HolderBusyError
	switch {
	case errors.As(err, &busy):
		if rn.waitingFor == nil {
			rn.waitingFor = make([][]heldRequest, len(rn.names))
		}
		if !h.woken {
			// Its wait for the holder ends then, whatever else happens.
			h.woken = true
			rn.push(event{at: h.at + rn.cfg.HolderWait, engine: -1})
		}
		wi := rn.byName[busy.Worker]
		rn.waitingFor[wi] = insertByArrival(rn.waitingFor[wi], h)
		return nil, nil
	case errors.Is(err, router.ErrOverloaded) || errors.Is(err, router.ErrSaturated):
		rn.held = insertByArrival(rn.held, h)
		if errors.Is(err, router.ErrSaturated) && rn.scraped != nil && rn.scrapeWake != rn.nextScrape {
			// Saturation is read at scrapes: the next may find an engine with room
			// after the last pass has ended, and nothing else would try it then, as
			// the server's dispatcher does every RetryInterval.
			rn.scrapeWake = rn.nextScrape
			rn.push(event{at: rn.nextScrape, engine: -1})
		}
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("route request %d: %w", h.req.ID, err)
	}
	return d, nil
}

// waitsForHolder reports whether h may still wait for its holder: HolderWait has not
// passed since it arrived.
func (rn *run) waitsForHolder(h heldRequest) bool {
	return rn.cfg.HolderWait > 0 && rn.now-h.at < rn.cfg.HolderWait
}

// insertByArrival puts h into q, which is in arrival order, before the requests that came
// at the same instant or later (a request held again was ahead of them).
func insertByArrival(q []heldRequest, h heldRequest) []heldRequest {
	i, _ := slices.BinarySearchFunc(q, h.at, func(x heldRequest, at time.Duration) int { return cmp.Compare(x.at, at) })
	return slices.Insert(q, i, h)
}

// heldCount is the requests flow control holds.
func (rn *run) heldCount() int {
	n := len(rn.held)
	for _, q := range rn.waitingFor {
		n += len(q)
	}
	return n
}

// dispatchHeld routes the held requests while a worker can take them (flow control,
// as a request ends or a wait for a holder ends), as the server's dispatcher does: of
// the queues' heads (the general queue's and each holder's), the oldest first, until
// none goes. A request whose wait for its holder has ended joins the general queue.
func (rn *run) dispatchHeld() error {
	for wi, q := range rn.waitingFor {
		kept := q[:0]
		for _, h := range q {
			if !rn.waitsForHolder(h) {
				rn.held = insertByArrival(rn.held, h)
				continue
			}
			kept = append(kept, h)
		}
		rn.waitingFor[wi] = kept
	}
	for {
		went := false
		for _, q := range rn.heldHeads() {
			h := (*q)[0]
			*q = (*q)[1:]
			if rn.scraped == nil {
				rn.reportEngineRequests()
			}
			d, err := rn.routeHeld(rn.replicas[0], h)
			if err != nil {
				return err
			}
			if d == nil {
				continue // held again, in the queue its refusal names
			}
			if err := rn.start(h.req, d, h.at); err != nil {
				return err
			}
			went = true
			break
		}
		if !went {
			return nil
		}
	}
}

// heldHeads are the non-empty held queues, their heads oldest first (the general
// queue's first at one instant).
func (rn *run) heldHeads() []*[]heldRequest {
	var queues []*[]heldRequest
	if len(rn.held) > 0 {
		queues = append(queues, &rn.held)
	}
	for wi := range rn.waitingFor {
		if len(rn.waitingFor[wi]) > 0 {
			queues = append(queues, &rn.waitingFor[wi])
		}
	}
	slices.SortStableFunc(queues, func(a, b *[]heldRequest) int { return cmp.Compare((*a)[0].at, (*b)[0].at) })
	return queues
}

// start sends a routed request to its engine; arrival is when it came (earlier than
// now when flow control held it).
func (rn *run) start(r *Req, d *router.Decision, arrival time.Duration) error {
	wi := rn.pickRank(rn.byName[d.Worker]) // the engine
	sr := &sim.Request{ID: r.ID, Salt: index.Salt(rn.cfg.Model, r.LoRA, ""), LoRA: r.LoRA, Prompt: r.Prompt, Output: r.Output}
	f := &flight{req: r, decision: d, arrival: arrival, held: rn.now - arrival, worker: wi}
	engine := rn.engines[wi]
	if d.Prefill != nil {
		// The routing sidecar's first leg: the prefill worker computes the prompt and
		// one token; the decode worker's request waits for it and the KV transfer.
		sr.Transferred, f.decode = true, sr
		engine = rn.engines[rn.byName[d.Prefill.Worker]]
		sr = &sim.Request{ID: r.ID, Salt: sr.Salt, LoRA: r.LoRA, Prompt: r.Prompt, Output: r.Output[:1]}
	}
	if err := engine.Add(sr); err != nil {
		d.Release()
		return err
	}
	if rn.log != nil {
		f.prev = rn.log.routed(r, wi)
	}
	rn.inflight[sr] = f
	return nil
}

func (rn *run) endPass(wi int) {
	outs, events := rn.engines[wi].EndPass(rn.now)
	if rn.replicas[0].appliers != nil && len(events) > 0 {
		rn.publish(wi, events)
	}
	if rn.log != nil {
		rn.log.passEnded(wi, rn.now, rn.engines[wi], events)
	}
	for _, o := range outs {
		f := rn.inflight[o.Request]
		if f.decode != nil {
			// The prefill leg ends at its one token: the KV the decode worker lacks
			// crosses over, then the decode worker takes the request.
			if !o.Finished {
				continue
			}
			delete(rn.inflight, o.Request)
			sr, dw := f.decode, rn.engines[f.worker]
			f.decode, f.prefilled = nil, o.Request.RecomputedTokens
			f.transferred = len(sr.Prompt) - dw.CachedPrefixTokens(sr.Prompt, sr.Salt)
			rn.inflight[sr] = f
			rn.push(event{at: rn.now + sim.TransferTime(f.transferred), engine: f.worker, transfer: sr})
			continue
		}
		if f.decision == nil { // past kvroute: it loads the engine, nothing else
			if o.Finished {
				delete(rn.inflight, o.Request)
				for _, a := range rn.workload.Completed(f.req, rn.now) {
					rn.push(event{at: a.At, arrival: a.Req})
				}
			}
			continue
		}
		if o.FirstToken {
			f.first = rn.now
			f.decision.FirstToken()
		}
		if !o.Finished {
			continue
		}
		f.decision.Release()
		delete(rn.inflight, o.Request)
		rec := record{
			req: f.req, worker: wi, arrival: f.arrival, ttft: f.first - f.arrival, e2e: rn.now - f.arrival,
			prompt: len(f.req.Prompt), predicted: f.decision.PredictedCachedTokens, cached: o.Request.CachedTokens,
			recomputed: o.Request.RecomputedTokens, preempted: o.Request.PreemptedTokens, host: o.Request.HostTokens,
			blocksLost: f.decision.BlocksLost, held: f.held,
		}
		if f.decision.Prefill != nil {
			// Computed anywhere: by the prefill worker, then by the decode worker.
			// cached stays the decode worker's own hits, which the decision predicted.
			rec.split, rec.transfer = true, o.Request.TransferredTokens
			rec.recomputed += f.prefilled
		}
		rn.records = append(rn.records, rec)
		next := rn.workload.Completed(f.req, rn.now)
		if rn.log != nil {
			rn.log.done(f, o.Request, len(next) > 0)
		}
		for _, a := range next {
			rn.push(event{at: a.At, arrival: a.Req})
		}
	}
	if err := rn.dispatchHeld(); err != nil && rn.failed == nil {
		rn.failed = err
	}
}

// publish passes one pass's events of engine ei through the KV events wire format to
// the index: to its worker's applier, on its rank's stream.
func (rn *run) publish(ei int, events []sim.Event) {
	wi, rank := ei/rn.rankCount(), ei%rn.rankCount()
	b := kvevents.Batch{TS: rn.now.Seconds()}
	for _, ev := range events {
		b.Events = append(b.Events, ev.Wire(rn.cfg.Engine.BlockSize, ""))
	}
	payload, err := kvevents.Encode(&b, kvevents.Form(wi%2))
	for _, rep := range rn.replicas {
		if err != nil {
			break
		}
		err = rep.appliers[wi].Apply(rank, payload)
	}
	if err != nil {
		rn.failed = fmt.Errorf("worker %s: %w", rn.names[wi], err)
	}
}

// startPasses starts a pass on every idle engine that has work.
func (rn *run) startPasses() {
	for i, e := range rn.engines {
		if e.Busy() || e.Idle() {
			continue
		}
		d, ok, err := e.StartPass(rn.now)
		if err != nil || !ok {
			continue
		}
		if rn.log != nil {
			rn.log.passStarted(i, rn.now)
		}
		rn.push(event{at: rn.now + max(d, time.Microsecond), engine: i})
	}
}

func (rn *run) push(ev event) {
	ev.seq = rn.seq
	rn.seq++
	heap.Push(&rn.events, ev)
}

// event is an arrival (arrival set), a split request's KV arriving at its decode
// worker (transfer set), a time held requests are tried again (engine -1: a wait for
// a holder ends, or a scrape may end a saturation), or the end of an engine's pass.
type event struct {
	at       time.Duration
	seq      int
	arrival  *Req
	engine   int
	transfer *sim.Request
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}
