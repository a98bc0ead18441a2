package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/kvevents"
)

// Config sizes a simulated worker. Defaults are WORKLOADS §1's.
type Config struct {
	NumGPUBlocks     int `yaml:"num_gpu_blocks" json:"num_gpu_blocks"`
	BlockSize        int `yaml:"block_size" json:"block_size"`
	MaxNumSeqs       int `yaml:"max_num_seqs" json:"max_num_seqs"`
	MaxBatchedTokens int `yaml:"max_num_batched_tokens" json:"max_num_batched_tokens"`
	// MaxLoRAs is how many distinct LoRA adapters may run at once (vLLM's --max-loras):
	// a waiting adapter request is passed over while that many others run, as vLLM's
	// scheduler skips it. 0: no limit.
	MaxLoRAs int `yaml:"max_loras" json:"max_loras"`
	// HostBlocks is the capacity in blocks of a host (CPU) tier behind the device cache,
	// as vLLM's native CPU offloading (OffloadingConnector) or LMCache adds: every block
	// the device caches is written through to it, admission loads the prompt blocks it
	// holds beyond the device's prefix hits (HostLoadTime), and its stores and
	// evictions are KV events with Event.Host. 0: no host tier.
	HostBlocks int `yaml:"host_blocks" json:"host_blocks"`
	// HostChunkBlocks makes the host tier hold chunks of that many blocks, as LMCache
	// does (256-token chunks: 4 of 64 tokens): a chunk is written once its blocks are
	// all computed, admission loads the chunks held from the prompt's start (whole
	// ones, beyond the device's hits), and each store is an event of its own naming the
	// chunk, its parent chunk and its tokens (LMCache's multiprocess form; removals
	// name chunks). 0 or 1: blocks, as vLLM's OffloadingConnector.
	HostChunkBlocks int `yaml:"host_chunk_blocks" json:"host_chunk_blocks"`
}

// DefaultConfig returns 16,384 blocks of 64 tokens, 256 sequences, 8,192 tokens a pass.
func DefaultConfig() Config {
	return Config{NumGPUBlocks: 16384, BlockSize: 64, MaxNumSeqs: 256, MaxBatchedTokens: 8192}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.NumGPUBlocks <= 0:
		return fmt.Errorf("num_gpu_blocks: must be > 0, got %d", c.NumGPUBlocks)
	case c.BlockSize <= 0:
		return fmt.Errorf("block_size: must be > 0, got %d", c.BlockSize)
	case c.MaxNumSeqs <= 0:
		return fmt.Errorf("max_num_seqs: must be > 0, got %d", c.MaxNumSeqs)
	case c.MaxBatchedTokens <= 0:
		return fmt.Errorf("max_num_batched_tokens: must be > 0, got %d", c.MaxBatchedTokens)
	case c.MaxLoRAs < 0:
		return fmt.Errorf("max_loras: must be ≥ 0 (0: no limit), got %d", c.MaxLoRAs)
	case c.HostBlocks < 0:
		return fmt.Errorf("host_blocks: must be ≥ 0 (0: no host tier), got %d", c.HostBlocks)
	case c.HostChunkBlocks < 0 || c.HostChunkBlocks > max(c.HostBlocks, 1):
		return fmt.Errorf("host_chunk_blocks: must be from 0 to host_blocks (%d), got %d", c.HostBlocks, c.HostChunkBlocks)
	}
	return nil
}

// Request is one generation request. The caller sets the exported input fields; the
// engine fills the outcome fields.
type Request struct {
	ID int
	// Salt namespaces the block hashes (index.Salt of the model), so the engine's cache
	// keys equal the router's block hashes.
	Salt uint64
	// LoRA names the request's LoRA adapter ("" for the base model). The engine only
	// carries it to the request's BlockStored events, as vLLM reports lora_name; Salt
	// must already separate the adapter's blocks.
	LoRA string
	// CacheSalt is the request's cache_salt ("" for none). As LoRA, the engine only
	// carries it to the BlockStored event of the prompt's first block, in that block's
	// extra keys as vLLM folds it in; Salt must already separate the salted blocks.
	CacheSalt string
	// Prompt is the prompt's token ids; Output the ids the engine will generate, in
	// order (a replay knows them so that a next turn's prompt can contain them).
	Prompt, Output []uint32
	// Transferred says a prefill worker computed the prompt's KV (disaggregated
	// prefill/decode; vLLM's kv_transfer_params.do_remote_prefill): at first admission
	// the engine loads every prompt token beyond its own prefix hits but the last, and
	// computes that last one in the admitting pass as a decode step, as vLLM's decode
	// engine reads the remote blocks and then runs one token. The loaded blocks are
	// stored in the cache at the pass's end like computed ones. The caller models the
	// transfer's time (TransferTime) before Add. A preempted request recomputes as any
	// other.
	Transferred bool

	// Outcome. At first admission CachedTokens + TransferredTokens + HostTokens +
	// RecomputedTokens is the prompt's length.
	CachedTokens      int // prompt tokens served from the cache at first admission
	TransferredTokens int // prompt tokens loaded from the prefill worker at first admission (Transferred only)
	// HostTokens is the prompt tokens loaded from the host tier at first admission
	// (Config.HostBlocks; never for a transferred request, whose prompt the prefill
	// worker computed).
	HostTokens int
	// RecomputedTokens is the prompt tokens computed at first admission: Prompt −
	// CachedTokens − HostTokens, or for a transferred request the one it computes
	// (Prompt − CachedTokens − TransferredTokens), which the pass runs as a decode.
	RecomputedTokens int
	PreemptedTokens  int // tokens recomputed after preemptions (not those loaded from the host tier)
	Preemptions      int
	Generated        int
	// AdmittedAt is the start of the pass that first admitted the request.
	AdmittedAt time.Duration

	computed int      // tokens whose KV is computed
	hashes   []uint64 // chained hashes of the full blocks of Prompt+Output, as far as needed
	blocks   []*block // blocks[i] holds tokens [i·bs, (i+1)·bs)
	stored   int      // leading blocks already stored in the cache
	saved    int      // leading chunks written to a chunked host tier since admission
	admitted bool
	aborted  bool // aborted while a pass computed it: EndPass frees its blocks
	// counted is need() at the last admission: the tokens RecomputedTokens (first
	// admission) or PreemptedTokens (later ones) counted up to; unreached, after a
	// preemption, those of them that were not computed yet, so not recomputed.
	counted, unreached int
}

// need is how many tokens' KV must be computed before the next token is produced: the
// prompt and every generated token.
func (r *Request) need() int { return len(r.Prompt) + r.Generated }

// Done reports whether the request has produced all its output.
func (r *Request) Done() bool { return r.Generated >= len(r.Output) }

// Event is a KV cache event of a pass (vLLM's BlockStored / BlockRemoved), carrying the
// engine's chained block hashes.
type Event struct {
	Stored  bool // true: BlockStored; false: BlockRemoved
	Hashes  []uint64
	Request int // for a store: the request that computed the blocks
	// For a device store, as vLLM reports it: the hash of the block before the first
	// one (HasParent false for a sequence's first block) and the blocks' token ids. A
	// host store has neither: its blocks are the device's, named by their hashes.
	Parent    uint64
	HasParent bool
	Tokens    []uint32
	// LoRA is the storing request's adapter ("" for the base model).
	LoRA string
	// CacheSalt is the storing request's cache_salt, on the store of its sequence's
	// first block only (HasParent false): vLLM folds the salt into that block's hash
	// alone, the chain carries it on.
	CacheSalt string
	// Host says the event is the host tier's (Config.HostBlocks), not the device's: a
	// store is a run of blocks newly written through to it, a removal its evictions.
	Host bool
}

// Output reports what a pass did to one request.
type Output struct {
	Request    *Request
	FirstToken bool // the pass produced the request's first token
	Finished   bool // the request produced its last token and left
}

// Engine is one simulated worker.
type Engine struct {
	cfg     Config
	pool    *pool
	host    *hostTier
	waiting []*Request
	running []*Request

	plan        []scheduled
	removed     []uint64 // hashes evicted while scheduling the current pass
	hostRemoved []uint64 // hashes the host tier evicted while ending the current pass
	loras       []string // the adapters running, while scheduling a pass with MaxLoRAs
	busy        bool

	// Counters since creation.
	PromptTokens      int // prompt tokens of admitted requests (first admission)
	RecomputedTokens  int // of which computed, the sum of the requests' RecomputedTokens
	TransferredTokens int // of which loaded from prefill workers, the sum of the requests' TransferredTokens
	HostTokens        int // of which loaded from the host tier, the sum of the requests' HostTokens
	PrefillTokens     int // every token computed as prefill, recomputes included
	Passes            int
	// HostReloadedTokens is the tokens preempted requests loaded from the host tier when
	// admitted again rather than recomputing them (PreemptedTokens leaves them out).
	HostReloadedTokens int
}

type scheduled struct {
	r      *Request
	tokens int
	decode bool
	loaded int // tokens loaded from the host tier at admission, before the pass computes
}

// ErrBusy is returned by StartPass while a pass is under way.
var ErrBusy = errors.New("sim: a pass is under way")

// New returns an idle engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Engine{cfg: cfg, pool: newPool(cfg.NumGPUBlocks), host: newHostTier(cfg.HostBlocks / cfg.chunk())}, nil
}

// Add queues a request. Requests with an empty prompt or no output are rejected.
func (e *Engine) Add(r *Request) error {
	if len(r.Prompt) == 0 || len(r.Output) == 0 {
		return fmt.Errorf("sim: request %d needs a prompt and at least one output token", r.ID)
	}
	e.waiting = append(e.waiting, r)
	return nil
}

// Abort removes a request that is waiting or running (its client went away), releasing
// its blocks. It reports whether the request was found. It may be called during a pass
// (a live server sleeps through the pass without holding its lock): a request the pass
// is computing leaves the running set at once, and the pass's end frees its blocks
// without storing or emitting anything for it.
func (e *Engine) Abort(r *Request, now time.Duration) bool {
	for i, x := range e.waiting {
		if x == r {
			e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
			return true
		}
	}
	for i, x := range e.running {
		if x == r {
			e.running = append(e.running[:i], e.running[i+1:]...)
			if e.busy && e.inPlan(r) {
				r.aborted = true
				return true
			}
			e.releaseBlocks(r, now)
			return true
		}
	}
	return false
}

func (e *Engine) inPlan(r *Request) bool {
	for _, s := range e.plan {
		if s.r == r {
			return true
		}
	}
	return false
}

func (e *Engine) releaseBlocks(r *Request, now time.Duration) {
	for _, b := range r.blocks {
		e.pool.release(b, now)
	}
	r.blocks = nil
}

// Running and Waiting are the engine's queue lengths (vllm:num_requests_running and
// vllm:num_requests_waiting).
func (e *Engine) Running() int { return len(e.running) }

// Waiting returns the number of queued requests.
func (e *Engine) Waiting() int { return len(e.waiting) }

// KVUsage is the share of blocks held by running requests (vllm:kv_cache_usage_perc).
func (e *Engine) KVUsage() float64 { return float64(e.pool.inUse()) / float64(e.cfg.NumGPUBlocks) }

// CachedBlocks is the number of blocks in the prefix cache, active or not.
func (e *Engine) CachedBlocks() int { return len(e.pool.cache) }

// HostCachedBlocks is the number of blocks the host tier holds.
func (e *Engine) HostCachedBlocks() int { return e.host.len() * e.cfg.chunk() }

// chunk is the blocks in one of the host tier's entries.
func (c Config) chunk() int { return max(c.HostChunkBlocks, 1) }

// Busy reports whether a pass is under way.
func (e *Engine) Busy() bool { return e.busy }

// Idle reports whether the engine has nothing to do.
func (e *Engine) Idle() bool { return len(e.waiting) == 0 && len(e.running) == 0 }

// StartPass schedules the next pass and returns its duration; ok is false when there is
// nothing to schedule. now is the pass's start time, used as blocks' last-use time.
func (e *Engine) StartPass(now time.Duration) (d time.Duration, ok bool, err error) {
	if e.busy {
		return 0, false, ErrBusy
	}
	e.plan, e.removed = e.plan[:0], e.removed[:0]
	budget := e.cfg.MaxBatchedTokens
	preempted := false

	// Running requests first, in order; if one cannot get a block, the newest running
	// request is preempted (possibly itself).
	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		n := min(r.need()-r.computed, budget)
		for !e.grow(r, r.computed+n) {
			victim := e.running[len(e.running)-1]
			e.preempt(victim, now)
			preempted = true
			if victim == r {
				n = 0
				break
			}
		}
		if n > 0 && i < len(e.running) && e.running[i] == r {
			e.plan = append(e.plan, scheduled{r: r, tokens: n, decode: r.Generated > 0 && n == 1 && r.computed == r.need()-1})
			budget -= n
		}
	}
	// Then waiting requests, first in first out, while the whole current sequence fits;
	// none in a pass that had to preempt (as vLLM). An adapter request that would run
	// one adapter too many is passed over and keeps its place.
	if e.cfg.MaxLoRAs > 0 {
		e.loras = e.loras[:0]
		for _, r := range e.running {
			e.noteLoRA(r)
		}
	}
	for next := 0; !preempted && next < len(e.waiting) && len(e.running) < e.cfg.MaxNumSeqs && budget > 0; {
		r := e.waiting[next]
		if e.cfg.MaxLoRAs > 0 && r.LoRA != "" && len(e.loras) >= e.cfg.MaxLoRAs && !slices.Contains(e.loras, r.LoRA) {
			next++
			continue
		}
		hits := e.prefixHits(r)
		idleHits := 0
		for _, b := range hits {
			if b.ref == 0 {
				idleHits++
			}
		}
		required := ceilDiv(r.need(), e.cfg.BlockSize) - len(hits)
		if required > e.pool.available()-idleHits {
			break
		}
		if next == 0 {
			e.waiting = e.waiting[1:]
		} else {
			e.waiting = slices.Delete(e.waiting, next, next+1)
		}
		if e.cfg.MaxLoRAs > 0 {
			e.noteLoRA(r)
		}
		for _, b := range hits {
			e.pool.take(b)
		}
		r.blocks = append(r.blocks[:0], hits...)
		r.stored, r.saved = len(hits), 0
		r.computed = len(hits) * e.cfg.BlockSize
		// A transferred request's loaded tokens count as computed: what is left is the
		// prompt's last token (Generated is 0 at first admission), a decode step.
		transfer := r.Transferred && !r.admitted
		// So do the tokens loaded from the host tier; their blocks are allocated below
		// with the computed ones (the admission check counted them) and cached at the
		// pass's end like them.
		loaded := 0
		if !transfer {
			loaded = e.hostHits(r, len(hits)) * e.cfg.BlockSize
			r.computed += loaded
		}
		if !r.admitted {
			r.admitted = true
			r.AdmittedAt = now
			r.CachedTokens = len(hits) * e.cfg.BlockSize
			r.HostTokens = loaded
			if transfer {
				r.TransferredTokens = r.need() - 1 - r.computed
				r.computed = r.need() - 1
				e.TransferredTokens += r.TransferredTokens
			}
			r.RecomputedTokens = len(r.Prompt) - r.computed
			e.PromptTokens += len(r.Prompt)
			e.RecomputedTokens += r.RecomputedTokens
			e.HostTokens += r.HostTokens
		} else {
			r.PreemptedTokens += max(r.need()-r.computed-r.unreached, 0)
			e.HostReloadedTokens += loaded
		}
		r.counted = r.need()
		n := min(r.need()-r.computed, budget)
		if !e.grow(r, r.computed+n) {
			panic("sim: admitted request could not get its blocks") // admission checked it
		}
		e.running = append(e.running, r)
		e.plan = append(e.plan, scheduled{r: r, tokens: n, decode: transfer, loaded: loaded})
		budget -= n
	}
	if len(e.plan) == 0 {
		return 0, false, nil
	}
	e.busy = true
	return e.passTime(), true, nil
}

// noteLoRA adds r's adapter to the adapters running in the pass being scheduled.
func (e *Engine) noteLoRA(r *Request) {
	if r.LoRA != "" && !slices.Contains(e.loras, r.LoRA) {
		e.loras = append(e.loras, r.LoRA)
	}
}

// EndPass completes the pass started last: computed blocks are stored, tokens emitted,
// finished requests leave. now is the pass's end time.
func (e *Engine) EndPass(now time.Duration) ([]Output, []Event) {
	if !e.busy {
		return nil, nil
	}
	e.busy = false
	e.Passes++
	e.hostRemoved = e.hostRemoved[:0]
	var outs []Output
	var events []Event
	if len(e.removed) > 0 {
		events = append(events, Event{Stored: false, Hashes: append([]uint64(nil), e.removed...)})
	}
	finished := false
	for _, s := range e.plan {
		r := s.r
		if r.aborted {
			e.releaseBlocks(r, now)
			continue
		}
		if !s.decode {
			e.PrefillTokens += s.tokens
		}
		r.computed += s.tokens
		events = e.storeFull(r, events)
		if r.computed < r.need() {
			continue
		}
		r.Generated++
		out := Output{Request: r, FirstToken: r.Generated == 1}
		if r.Done() {
			out.Finished = true
			finished = true
			e.releaseBlocks(r, now)
		}
		outs = append(outs, out)
	}
	if finished {
		kept := e.running[:0]
		for _, r := range e.running {
			if !r.Done() {
				kept = append(kept, r)
			}
		}
		e.running = kept
	}
	return outs, e.appendHostRemovals(events)
}

// appendHostRemovals appends the host tier's evictions of the pass as one removal
// event, after the pass's stores. A hash evicted before a request of the same pass
// wrote it through again is left out: the tier holds it, and its store event precedes
// the removal, which would undo it for a subscriber.
func (e *Engine) appendHostRemovals(events []Event) []Event {
	var gone []uint64
	for _, h := range e.hostRemoved {
		if !e.host.has(h) {
			gone = append(gone, h)
		}
	}
	if len(gone) == 0 {
		return events
	}
	return append(events, Event{Stored: false, Host: true, Hashes: gone})
}

// prefixHits returns the cached blocks of r's leading full blocks, leaving at least one
// token to compute (the engine must run the model to produce the next token).
func (e *Engine) prefixHits(r *Request) []*block {
	maxBlocks := (r.need() - 1) / e.cfg.BlockSize
	e.ensureHashes(r, maxBlocks)
	var hits []*block
	for i := 0; i < maxBlocks; i++ {
		b, ok := e.pool.cache[r.hashes[i]]
		if !ok {
			break
		}
		hits = append(hits, b)
	}
	return hits
}

// hostHits is how many of r's blocks from block from on the host tier holds in a row,
// up to the blocks admission may take, touching them: admission loads them rather
// than computing them.
func (e *Engine) hostHits(r *Request, from int) int {
	maxBlocks := (r.need() - 1) / e.cfg.BlockSize
	if g := e.cfg.chunk(); g > 1 {
		// Chunks load whole, counted from the prompt's start (LMCache's lookup); the
		// last one loads in part when the prompt ends inside it.
		chunks := 0
		for (chunks+1)*g <= len(r.hashes) && chunks*g < maxBlocks && e.host.has(e.chunkKey(r, chunks)) {
			chunks++
		}
		e.touchPrefix(r, chunks)
		return max(min(chunks*g, maxBlocks)-from, 0)
	}
	n := 0
	for i := from; i < maxBlocks && e.host.has(r.hashes[i]); i++ {
		n++
	}
	e.touchHost(r.hashes[from : from+n])
	return n
}

// chunkKey names chunk c of r's sequence on the host tier: the hash of its last block,
// which is chained over the whole prefix it ends.
func (e *Engine) chunkKey(r *Request, c int) uint64 { return r.hashes[(c+1)*e.cfg.chunk()-1] }

// touchHost marks the host copies of a run of a sequence's blocks used, deepest first,
// so its first block ends most recent: the tier then evicts leaves before the prefixes
// they extend, as vLLM's LRU offloading manager touches a request's blocks in reverse
// (a leaf is useless without its prefix, a prefix serves every leaf after it).
func (e *Engine) touchHost(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		e.host.touch(hashes[i])
	}
}

// touchPrefix is touchHost for the first n entries of r's sequence on the host tier:
// its first n blocks, or with a chunked tier its first n chunks.
func (e *Engine) touchPrefix(r *Request, n int) {
	for c := n - 1; c >= 0; c-- {
		e.host.touch(e.chunkKey(r, c))
	}
}

// CachedPrefixTokens is how many tokens of prompt's leading full blocks the prefix
// cache holds now, hashed with salt as admission hashes a request's blocks, and at most
// the blocks admission would take (the last prompt token is always computed). It changes
// nothing, not even the blocks' last use: a caller sizes a KV transfer with it before
// Add, and admission may find more or fewer blocks by then.
func (e *Engine) CachedPrefixTokens(prompt []uint32, salt uint64) int {
	if len(prompt) == 0 {
		return 0
	}
	bs := e.cfg.BlockSize
	maxBlocks := (len(prompt) - 1) / bs
	n := 0
	for _, h := range index.BlockHashes(nil, prompt[:maxBlocks*bs], bs, salt) {
		if _, ok := e.pool.cache[h]; !ok {
			break
		}
		n++
	}
	return n * bs
}

// grow gives r the blocks to hold tokens [0, upto); false if the pool ran out.
func (e *Engine) grow(r *Request, upto int) bool {
	for len(r.blocks) < ceilDiv(upto, e.cfg.BlockSize) {
		b, ok := e.pool.alloc(len(r.blocks), &e.removed)
		if !ok {
			return false
		}
		r.blocks = append(r.blocks, b)
	}
	return true
}

// preempt sends a running request back to the front of the queue, releasing its blocks:
// it will be recomputed (prefix hits permitting) when admitted again.
func (e *Engine) preempt(r *Request, now time.Duration) {
	for i, x := range e.running {
		if x == r {
			e.running = append(e.running[:i], e.running[i+1:]...)
			break
		}
	}
	e.releaseBlocks(r, now)
	r.unreached = max(r.counted-r.computed, 0)
	r.computed, r.stored, r.saved = 0, 0, 0
	r.Preemptions++
	e.waiting = append([]*Request{r}, e.waiting...)
}

// storeFull caches r's newly computed full blocks and appends their BlockStored
// events to events: one per run of consecutive newly cached blocks (a block another
// request cached first is not stored again, and breaks the run). Each newly cached
// block is written through to the host tier; those it did not hold yet follow as one
// host store event, named by their hashes alone.
func (e *Engine) storeFull(r *Request, events []Event) []Event {
	full := r.computed / e.cfg.BlockSize
	e.ensureHashes(r, full)
	bs := e.cfg.BlockSize
	open := false // the last event is a run still being extended
	var host []uint64
	g := e.cfg.chunk()
	for ; r.stored < full; r.stored++ {
		i := r.stored
		if !e.pool.store(r.blocks[i], r.hashes[i]) {
			open = false
			continue
		}
		if !open {
			ev := Event{Stored: true, Request: r.ID, HasParent: i > 0, LoRA: r.LoRA}
			if i > 0 {
				ev.Parent = r.hashes[i-1]
			} else {
				ev.CacheSalt = r.CacheSalt
			}
			events = append(events, ev)
			open = true
		}
		ev := &events[len(events)-1]
		ev.Hashes = append(ev.Hashes, r.hashes[i])
		ev.Tokens = append(ev.Tokens, r.sequence(i*bs, (i+1)*bs)...)
		if g == 1 && e.host.put(r.hashes[i], &e.hostRemoved) {
			host = append(host, r.hashes[i])
		}
	}
	if g > 1 {
		return e.saveChunks(r, full, events)
	}
	if len(host) == 0 {
		return events
	}
	e.touchPrefix(r, full) // written in chain order: the prefix first again
	return append(events, Event{Stored: true, Host: true, Request: r.ID, Hashes: host})
}

// saveChunks writes r's whole chunks of its full blocks through to a chunked host tier,
// from the first chunk not saved since its admission, as LMCache saves a request's
// chunks past those it held itself (lmcache_cached_tokens), whatever the device
// holds: a chunk already on the host is touched, a new one is a store event with its
// parent chunk and tokens.
func (e *Engine) saveChunks(r *Request, full int, events []Event) []Event {
	g, bs := e.cfg.chunk(), e.cfg.BlockSize
	whole := full / g
	if r.saved >= whole {
		return events
	}
	for c := r.saved; c < whole; c++ {
		key := e.chunkKey(r, c)
		if !e.host.put(key, &e.hostRemoved) {
			continue
		}
		ev := Event{Stored: true, Host: true, Request: r.ID, Hashes: []uint64{key}, HasParent: c > 0, Tokens: r.sequence(c*g*bs, (c+1)*g*bs)}
		if c > 0 {
			ev.Parent = e.chunkKey(r, c-1)
		}
		events = append(events, ev)
	}
	r.saved = whole
	e.touchPrefix(r, whole) // the prefix first again, as the blocks' tier does
	return events
}

// sequence returns tokens [from, to) of the request's prompt followed by its output.
func (r *Request) sequence(from, to int) []uint32 {
	out := make([]uint32, 0, to-from)
	for i := from; i < to; i++ {
		if i < len(r.Prompt) {
			out = append(out, r.Prompt[i])
		} else {
			out = append(out, r.Output[i-len(r.Prompt)])
		}
	}
	return out
}

// ensureHashes extends r's chained hashes to cover n full blocks of Prompt+Output.
func (e *Engine) ensureHashes(r *Request, n int) {
	if len(r.hashes) >= n {
		return
	}
	seq := make([]uint32, 0, len(r.Prompt)+len(r.Output))
	seq = append(append(seq, r.Prompt...), r.Output...)
	r.hashes = index.BlockHashes(r.hashes[:0], seq, e.cfg.BlockSize, r.Salt)
}

// Chunk is one request's share of a pass: Tokens computed, as a decode or as prompt
// (prefill, or recompute after a preemption). The one token a transferred request
// computes when first admitted is a decode.
type Chunk struct {
	Request *Request
	Tokens  int
	Decode  bool
}

// Pass returns the chunks of the pass under way or, between passes, of the last one,
// in scheduling order: what a replay's log reports of each pass. The slice is the
// caller's.
func (e *Engine) Pass() []Chunk {
	out := make([]Chunk, len(e.plan))
	for i, s := range e.plan {
		out[i] = Chunk{Request: s.r, Tokens: s.tokens, Decode: s.decode}
	}
	return out
}

// passTime is the published fitted model of Dynamo's mocker (WORKLOADS §1), in ms,
// plus HostLoadTime of the tokens the pass's admissions load from the host tier.
func (e *Engine) passTime() time.Duration {
	prefill, decode, loaded := 0, false, 0
	for _, s := range e.plan {
		loaded += s.loaded
		if s.decode {
			decode = true
		} else {
			prefill += s.tokens
		}
	}
	ms := 0.0
	if prefill > 0 {
		t := float64(prefill)
		ms += 4.209989e-7*t*t + 1.518344e-2*t + 16.50142
	}
	if decode {
		u := e.KVUsage()
		ms += math.Max(1, -25.74*u*u+54.01*u+5.74)
	}
	return time.Duration(ms*float64(time.Millisecond)) + HostLoadTime(loaded)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Wire returns the event as an engine publishes it (kvevents' wire form), in medium
// ("" leaves it absent): a store with its parent, token ids and, for an adapter's
// blocks, lora_name and the name in every block's extra keys, then for a salted
// sequence's first block its cache_salt in that block's, as vLLM sends them. A
// host tier's event is in "CPU" whatever medium says, and a host store names its
// blocks by hash alone (no parent, token ids or adapter), as vLLM's OffloadingConnector
// reports them: its host copies keep the device blocks' hashes. A host tier of chunks
// (Config.HostChunkBlocks) sends each chunk with its parent and tokens, block_size the
// chunk's length, and no adapter, as LMCache does.
func (ev Event) Wire(blockSize int, medium string) kvevents.Event {
	if ev.Host {
		medium = "CPU"
	}
	if !ev.Stored {
		return kvevents.Event{Type: kvevents.TypeBlockRemoved, BlockHashes: ev.Hashes, Medium: medium}
	}
	if ev.Host && len(ev.Tokens) > 0 {
		return kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: ev.Hashes, Parent: ev.Parent, HasParent: ev.HasParent,
			TokenIDs: ev.Tokens, BlockSize: len(ev.Tokens) / len(ev.Hashes), Medium: medium}
	}
	out := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: ev.Hashes, Parent: ev.Parent, HasParent: ev.HasParent,
		TokenIDs: ev.Tokens, BlockSize: blockSize, Medium: medium}
	if ev.LoRA != "" || ev.CacheSalt != "" {
		out.LoRAName = ev.LoRA
		out.ExtraKeys = make([]kvevents.ExtraKeys, len(ev.Hashes))
		if ev.LoRA != "" {
			for i := range out.ExtraKeys {
				out.ExtraKeys[i].Strings = []string{ev.LoRA}
			}
		}
		if ev.CacheSalt != "" {
			// vLLM's extra keys are the adapter's name, then the salt on block 0.
			out.ExtraKeys[0].Strings = append(out.ExtraKeys[0].Strings, ev.CacheSalt)
		}
	}
	return out
}

// Adapters lists the LoRA adapters of the running and of the waiting requests, each
// once, in order of first appearance (vLLM's running_lora_adapters and
// waiting_lora_adapters).
func (e *Engine) Adapters() (running, waiting []string) {
	collect := func(rs []*Request) []string {
		var out []string
		for _, r := range rs {
			if r.LoRA != "" && !slices.Contains(out, r.LoRA) {
				out = append(out, r.LoRA)
			}
		}
		return out
	}
	return collect(e.running), collect(e.waiting)
}
