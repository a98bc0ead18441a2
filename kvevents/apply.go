package kvevents

import (
	"encoding/binary"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/index"
)

// Index is what the consumer needs of the index. *index.EventIndex satisfies it.
type Index interface {
	BlockStored(worker string, hashes []uint64) error
	BlockRemoved(worker string, hashes []uint64) error
	// OffloadStored and OffloadRemoved take the blocks of the offload tiers
	// (Config.OffloadTiers), which do not count as held.
	OffloadStored(worker string, hashes []uint64) error
	OffloadRemoved(worker string, hashes []uint64) error
	// SetOffloadGrain says the offload tiers hold the worker's blocks in chunks of that
	// many of kvroute's, loaded whole (1: kvroute's blocks), and whether its engine
	// looks them up from the prompt's start (LMCache) or from the chunk holding the end
	// of its device hit (vLLM's OffloadingConnector).
	SetOffloadGrain(worker string, blocks int, fromStart bool)
	// OffloadedHeld sets held[i] to whether the worker's offloaded blocks include
	// hashes[i].
	OffloadedHeld(worker string, hashes []uint64, held []bool)
	AllBlocksCleared(worker string) error
	Heard(worker string)
	SetMode(worker string, mode index.Mode) error
	Mode(worker string) index.Mode
	Awaiting(worker string) (since time.Time, ok bool)
	ConfirmedEntries(worker string) int
	OffloadedEntries(worker string) int
}

// WorkerSpec is what applying one worker's events needs to know of it.
type WorkerSpec struct {
	Name string
	// Model salts the recomputed hashes, as it salts the requests' (router.Worker.EventModel).
	Model string
	// BlockSize is kvroute's block size: events with another are not applied.
	BlockSize int
	// Ranks is the number of data-parallel ranks (streams).
	Ranks int
	// FirstRank is the data-parallel rank of stream 0 (router.KVEvents.FirstRank): a
	// batch of stream r names rank FirstRank + r.
	FirstRank int
	// MaxEntries bounds the worker's engine-hash map of held tiers (Config.Tiers),
	// summed over its ranks and cache groups; reaching it clears the worker (an engine
	// that stores without ever removing is broken or hostile).
	MaxEntries int
	// MaxOffloaded bounds the map of the offload tiers (Config.OffloadTiers) apart:
	// reaching it clears what the worker reported there, never its device blocks
	// (0: MaxEntries).
	MaxOffloaded int
	// OffloadBlockSize, when above 0, replaces Config.OffloadBlockSize for this worker
	// (workers[].kv_events.offload_block_size).
	OffloadBlockSize int
}

// Applier applies one worker's event batches to the index. It recomputes kvroute's own
// chained hash of every stored block from its token ids and keeps, per (rank, tier,
// cache group), engine hash → own hash, so BlockRemoved can be applied whatever hash
// algorithm the engine uses. Safe for concurrent use (one lock per worker).
type Applier struct {
	spec    WorkerSpec
	cfg     Config
	idx     Index
	metrics *Metrics
	log     *slog.Logger
	base    uint64 // index.Salt(model, "", "")

	mu      sync.Mutex
	dec     *Decoder
	gone    [tierOffloaded + 1][]uint64 // scratch: blocks leaving each use's index
	sources map[sourceKey]*source
	entries [tierOffloaded + 1]int // engine-hash entries per use, summed over its sources
	// refs[use] counts, per own hash, the mappings to it from the sources of one use
	// (held or offloaded tiers); nil while that use has one source. A block leaves a
	// use's index when its last mapping there goes.
	refs [tierOffloaded + 1]map[uint64]uint32
	// skipped holds the cache groups of each rank a BlockStored last said cannot be
	// indexed (sliding window, Mamba, …), at most maxGroups per rank, until the rank is
	// cleared: a removal there is counted not_indexable unless the group holds blocks.
	skipped map[groupKey]struct{}
	grain   int // kvroute's blocks in one of the offload tiers' chunks, as last told the index (0: never)
	// chains is set once an offload store named blocks spanning several device blocks by
	// hash alone: from then on the held sources keep their blocks' parents (source.parents).
	chains bool
	// warnedBlockSize: a device store of another block size than kvroute's was warned
	// of (once per worker).
	warnedBlockSize bool
	own             []uint64            // scratch
	chain           []uint64            // scratch: a host block's device blocks
	named           map[uint64]struct{} // scratch: the engine hashes a store by hash alone named so far
	walked          map[uint64]struct{} // scratch: the engine hashes of one device chain walked so far
}

// SetMaxEntries changes the bounds of the worker's engine-hash maps, of the held and of
// the offload tiers (its capacity became known). A map already over a smaller bound is
// cleared at its next stored block.
func (a *Applier) SetMaxEntries(held, offloaded int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.spec.MaxEntries, a.spec.MaxOffloaded = held, offloaded
}

// limit is the most engine-hash entries use's sources may hold.
func (a *Applier) limit(use tierUse) int {
	if use == tierOffloaded && a.spec.MaxOffloaded > 0 {
		return a.spec.MaxOffloaded
	}
	return a.spec.MaxEntries
}

// groupKey names a rank's cache group.
type groupKey struct{ rank, group int }

// sourceKey names one stream of blocks: a rank's cache group on one tier. Each has
// its own engine-hash namespace (a hybrid model's groups hash the same tokens alike).
type sourceKey struct {
	rank  int
	tier  Tier
	group int
}

type source struct {
	use tierUse           // what the index makes of its blocks (held or offloaded)
	own map[uint64]uint64 // engine hash → own chained hash (a coarse block's last)
	// spans holds, for an engine block coarser than kvroute's (an offload tier's
	// chunks), its blocks before the last, in chain order; nil until one comes.
	spans map[uint64][]uint64
	// salts holds the salt of blocks whose chain began with a cache salt (vLLM sends
	// it on block 0 only; the children inherit it through the chain). Blocks without
	// one use the worker's base salt for their LoRA.
	salts map[uint64]uint64
	// parents maps a held tier's engine hash to its parent's (the event's parent for its
	// first block, the block before for the others); roots have none. An offload store
	// of blocks spanning several device blocks, named by the last one's hash alone
	// (vLLM's OffloadingConnector), finds the others through it. Kept only once such a
	// store came (Applier.chains): it costs ingest about a sixth.
	parents map[uint64]uint64
	// tomb remembers the last tombCap removed blocks, so a block stored after its
	// parent was evicted (an engine that computed a duplicate of a cached block, then
	// saw the cached copy evicted) still gets its place in the chain.
	tomb     map[uint64]tombstone
	tombRing []uint64
	tombNext int
}

type tombstone struct {
	own, salt, parent uint64
	salted, hasParent bool
}

// tombCap bounds each source's tombstones.
const tombCap = 1024

// block returns the own hash and chain salt of the block an engine hash names, live or
// recently removed: a store's parent, or the device block a host store names. A nil
// source (none made yet) knows no block.
func (s *source) block(engine uint64) (own, salt uint64, salted, ok bool) {
	if s == nil {
		return 0, 0, false, false
	}
	if own, ok := s.own[engine]; ok {
		salt, salted := s.salts[engine]
		return own, salt, salted, true
	}
	if t, ok := s.tomb[engine]; ok {
		return t.own, t.salt, t.salted, true
	}
	return 0, 0, false, false
}

// parentEngine returns the engine hash of a held block's parent, live or recently
// removed; ok is false for a root or an unknown block.
func (s *source) parentEngine(engine uint64) (parent uint64, ok bool) {
	if _, live := s.own[engine]; live {
		parent, ok = s.parents[engine]
		return parent, ok
	}
	t, ok := s.tomb[engine]
	return t.parent, ok && t.hasParent
}

func (s *source) bury(engine uint64, t tombstone) {
	if len(s.tombRing) < tombCap {
		s.tombRing = append(s.tombRing, engine)
	} else {
		delete(s.tomb, s.tombRing[s.tombNext])
		s.tombRing[s.tombNext] = engine
		s.tombNext = (s.tombNext + 1) % tombCap
	}
	s.tomb[engine] = t
}

// NewApplier returns the applier of one worker; m and log may be nil.
func NewApplier(spec WorkerSpec, cfg Config, idx Index, m *Metrics, log *slog.Logger) *Applier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	spec.Ranks = max(spec.Ranks, 1)
	return &Applier{spec: spec, cfg: cfg, idx: idx, metrics: m, log: log.With("worker", spec.Name),
		base: index.Salt(spec.Model, "", ""), dec: NewDecoder(), sources: map[sourceKey]*source{}, skipped: map[groupKey]struct{}{},
		// A configured offloaded block size says from the start that host blocks span
		// several device blocks: chain the device's from its first store.
		chains: spec.BlockSize > 0 && offloadBlockSize(spec, cfg) > spec.BlockSize}
}

// offloadBlockSize is the worker's configured offloaded block size: its own, else the
// fleet's; 0 when neither is set.
func offloadBlockSize(spec WorkerSpec, cfg Config) int {
	if spec.OffloadBlockSize > 0 {
		return spec.OffloadBlockSize
	}
	return cfg.OffloadBlockSize
}

// Apply decodes one payload of rank's stream and applies its events in order, without
// sequence checks (the streams do those). An undecodable payload is an error wrapping
// [ErrPayload] and changes nothing.
func (a *Applier) Apply(rank int, payload []byte) error {
	return a.applyAt(rank, payload, time.Now())
}

// applyAt is Apply with the clock reading the event lag is taken against.
func (a *Applier) applyAt(rank int, payload []byte, now time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.applyLocked(rank, payload, now)
}

// resetRank clears what one rank reported.
func (a *Applier) resetRank(rank int, reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.clearRank(rank, reason)
}

func (a *Applier) applyLocked(rank int, payload []byte, now time.Time) error {
	defer a.dec.Release() // neither the payload nor a large batch's buffers are kept
	b, err := a.dec.Decode(payload)
	if err != nil {
		return err
	}
	if b.HasRank && b.Rank != a.spec.FirstRank+rank && a.spec.Ranks > 1 {
		// A rank's stream carries that rank's batches; a stray one is not attributable.
		for _, ev := range b.Events {
			a.metrics.event(ev.Type, outcomeRankOutOfRange)
		}
		a.metrics.eventN(TypeUnknown, outcomeRankOutOfRange, b.Unknown)
		return nil
	}
	a.metrics.eventN(TypeUnknown, outcomeUnknownType, b.Unknown)
	if a.idx.Mode(a.spec.Name) != index.ModeEvents {
		if err := a.idx.SetMode(a.spec.Name, index.ModeEvents); err == nil {
			a.log.Info("kv events: worker in event mode")
		}
	}
	for i := range b.Events {
		a.applyEvent(rank, &b.Events[i])
	}
	a.idx.Heard(a.spec.Name)
	a.metrics.observeLag(b.TS, now)
	return nil
}

func (a *Applier) applyEvent(rank int, ev *Event) {
	switch ev.Type {
	case TypeBlockStored:
		a.metrics.event(ev.Type, a.stored(rank, ev))
	case TypeBlockRemoved:
		a.metrics.event(ev.Type, a.removed(rank, ev))
	case TypeAllBlocksCleared:
		a.clearRank(rank, reasonCleared)
		a.metrics.event(ev.Type, outcomeApplied)
	default:
		a.metrics.event(ev.Type, outcomeUnknownType)
	}
}

func (a *Applier) stored(rank int, ev *Event) string {
	tier := TierOf(ev.Medium)
	use := a.cfg.use(tier)
	if use == tierIgnored {
		return outcomeOtherTier
	}
	indexable := IndexableSpec(ev.SpecKind)
	if ev.SpecKind != "" && ev.Malformed == "" { // a malformed group_idx may be any int64
		a.markGroup(groupKey{rank, ev.GroupIdx}, indexable)
	}
	switch {
	case !indexable:
		return outcomeNotIndexable
	case use == tierOffloaded && ev.Malformed == "" && len(ev.BlockHashes) > 0 && len(ev.TokenIDs) == 0:
		return a.storedByHash(rank, tier, ev)
	}
	// Blocks coarser than kvroute's are taken from the offload tiers only (LMCache's
	// chunks): each is several of kvroute's, and the index ends the runs it finds
	// there at a chunk's end (SetOffloadGrain). A device's blocks must be kvroute's.
	coarse := use == tierOffloaded && ev.BlockSize > a.spec.BlockSize && ev.BlockSize%a.spec.BlockSize == 0
	if coarse && len(ev.BlockHashes) == 1 && len(ev.TokenIDs) == ev.BlockSize+1 {
		// LMCache (in-process, before its fix of bug #4543) sends each chunk but a
		// store's last with the next chunk's first token too.
		ev.TokenIDs = ev.TokenIDs[:ev.BlockSize]
	}
	switch {
	case ev.Malformed != "" || len(ev.BlockHashes) == 0 || ev.BlockSize <= 0 ||
		len(ev.TokenIDs) != ev.BlockSize*len(ev.BlockHashes) ||
		(ev.ExtraKeys != nil && len(ev.ExtraKeys) != len(ev.BlockHashes)):
		return outcomeMalformed
	case ev.BlockSize != a.spec.BlockSize && !coarse:
		if !a.warnedBlockSize {
			// Every later store of this engine is refused too: its worker never
			// matches a prompt. Said once, with both sizes, since it is a config error.
			a.warnedBlockSize = true
			a.log.Warn("kv events: the engine's blocks are not kvroute's size, so its stored blocks are refused (set block_size to the engines' block size)",
				"engine_block_size", ev.BlockSize, "block_size", a.spec.BlockSize, "tier", tier)
		}
		return outcomeBlockSize
	case a.spec.Model == "" || (ev.HasLoRAID && ev.LoRAName == ""):
		// Without a model, or with only an adapter's number, kvroute cannot salt the
		// blocks as it salts requests: they would never match, or match wrongly. (Extra
		// keys do not help: without lora_name the adapter's name in them cannot be told
		// from a cache salt.)
		return outcomeUnattributable
	}
	if coarse && ev.ZeroParent {
		// LMCache's 0: a chunk after others it had saved before, whose hash it does not
		// send. A root it is not.
		a.metrics.unknownParent(a.spec.Name)
		return outcomeUnknownParent
	}
	key := sourceKey{rank, tier, ev.GroupIdx}
	src := a.sources[key] // nil until a block of it is mapped

	// The chain's salt: inherited from the parent, or begun here with the cache salt.
	loraSalt := a.base
	if ev.LoRAName != "" {
		loraSalt = index.Salt(a.spec.Model, ev.LoRAName, "")
	}
	salt := loraSalt
	var parent uint64
	if ev.HasParent {
		p, s, salted, ok := src.block(ev.Parent)
		if !ok {
			// Its chain began before this stream was followed, or its parent left long
			// ago: the blocks cannot be hashed as requests hash them. Nothing stale
			// comes of skipping them; missed removals show as sequence gaps.
			a.metrics.unknownParent(a.spec.Name)
			return outcomeUnknownParent
		}
		parent = p
		if salted {
			salt = s
		}
	} else if cs := a.cacheSalt(ev); cs != "" {
		salt = index.Salt(a.spec.Model, ev.LoRAName, cs)
	}
	if src == nil {
		src = a.source(key)
	}

	own := a.own[:0]
	bs := ev.BlockSize
	for i := range ev.BlockHashes {
		tokens := ev.TokenIDs[i*bs : (i+1)*bs]
		seed := salt
		if ev.ExtraKeys != nil && ev.ExtraKeys[i].Other != 0 {
			// Multimodal and other keys a request cannot reproduce: a namespace of its
			// own, carried to the blocks after it through the chain.
			seed = mix(salt, ev.ExtraKeys[i].Other)
		}
		hasParent := i > 0 || ev.HasParent
		own = index.ChainHashes(own, parent, hasParent, tokens, a.spec.BlockSize, seed)
		parent = own[len(own)-1]
	}
	a.own = own
	per := bs / a.spec.BlockSize // kvroute's blocks in one of the engine's
	for i, h := range ev.BlockHashes {
		a.mapBlock(src, h, own[i*per:(i+1)*per], salt, salt != loraSalt)
		if src.use != tierHeld || !a.chains {
			continue
		}
		if src.parents == nil {
			src.parents = map[uint64]uint64{}
		}
		switch {
		case i > 0:
			src.parents[h] = ev.BlockHashes[i-1]
		case ev.HasParent:
			src.parents[h] = ev.Parent
		default:
			delete(src.parents, h)
		}
	}
	if src.use == tierOffloaded {
		a.setGrain(per, true)
	}
	a.forget(src.use)
	a.store(src.use, own)
	a.bound(src.use)
	return outcomeApplied
}

// setGrain tells the index the chunk size of the worker's offload tiers when it grows:
// the largest seen since the last clear, since an engine that saves a prompt's last
// partial chunk (LMCache with save_unfull_chunk) sends it shorter than its chunks.
// fromStart is where the engine's lookup of its chunks begins (Index.SetOffloadGrain):
// the store that grows the chunk size sets it.
func (a *Applier) setGrain(blocks int, fromStart bool) {
	if blocks > a.grain {
		a.grain = blocks
		a.idx.SetOffloadGrain(a.spec.Name, blocks, fromStart)
	}
}

// storedByHash applies an offload tier's store that names its blocks by the engine's
// hashes alone, without token ids or parent: what vLLM's OffloadingConnector sends (its
// host copies keep the hashes of the device blocks they copy). Each block is the one
// the same rank's device reported under that hash (still held, or recently removed);
// blocks the device never reported are skipped, since their tokens cannot be known.
//
// With an offloaded block size k times the GPU's (block_size_factor), each host block
// spans k device blocks and is named by the last one's hash, and vLLM sends block_size
// as k times kvroute's: the host block is then that device block and the k−1 before it
// in the device's chain, removed together, and the index walks whole ones from the
// one holding the end of the device hit, as vLLM looks them up. A host block some of
// whose device blocks the device never reported (or forgot) is skipped. vLLM versions
// that send block_size 0 cannot be told apart unless Config.OffloadBlockSize (or the
// worker's WorkerSpec.OffloadBlockSize) says k:
// else each of their host blocks is taken as its last device block alone, so the runs
// found break early (under-reported, never over).
func (a *Applier) storedByHash(rank int, tier Tier, ev *Event) string {
	size := ev.BlockSize
	if size == 0 {
		size = offloadBlockSize(a.spec, a.cfg) // newer vLLM sends 0 whatever its offloaded block size
	}
	use := a.cfg.use(tier)
	k := 1
	if size > a.spec.BlockSize && size%a.spec.BlockSize == 0 {
		k = size / a.spec.BlockSize
		if k > a.limit(use) {
			// One host block would be more blocks than the tier's map may hold.
			return outcomeBlockSize
		}
		// The device's blocks stored from now on keep their parents; the host blocks of
		// those stored before cannot be chained, and are skipped.
		a.chains = true
	}
	key := sourceKey{rank, tier, ev.GroupIdx}
	src := a.sources[key] // nil until a block of it is mapped
	// budget bounds the device blocks one store walks, found or not, at what the tier's
	// map may hold: a store naming more (each host block is k of them, and an engine
	// may name its device blocks in any number and order) would overflow it anyway, and
	// the rest of it is skipped.
	budget := a.limit(use)
	a.named = emptied(a.named)
	own := a.own[:0]
	for i, h := range ev.BlockHashes {
		if _, again := a.named[h]; again {
			continue // named twice in one store: once is the block
		}
		if budget < k {
			a.log.Warn("kv events: a host store by hash names more device blocks than the tier's bound; the rest skipped",
				"tiers", use.String(), "bound", a.limit(use), "block_size", size, "skipped", len(ev.BlockHashes)-i)
			break
		}
		a.named[h] = struct{}{}
		chain, salt, salted, ok := a.deviceChain(rank, h, k, a.chain[:0], &budget)
		a.chain = chain
		if !ok {
			continue
		}
		if src == nil {
			src = a.source(key)
		}
		own = append(own, chain...)
		a.mapBlock(src, h, own[len(own)-k:], salt, salted)
	}
	a.own = own
	if len(own) == 0 {
		return outcomeUnknownBlock
	}
	a.setGrain(k, false)
	a.forget(src.use)
	a.store(src.use, own)
	a.bound(src.use)
	return outcomeApplied
}

// emptied returns set emptied for reuse, or a new one in place of one a large store
// grew (clearing a map costs its capacity, not its length).
func emptied(set map[uint64]struct{}) map[uint64]struct{} {
	if set == nil || len(set) > 1024 {
		return map[uint64]struct{}{}
	}
	clear(set)
	return set
}

// deviceChain appends to dst, in chain order, kvroute's own hashes of the n device
// blocks a rank's held sources know ending with the engine hash's (live or recently
// removed), and returns the chain's salt (the last block's). ok is false when one of
// them is unknown: the engine hash, or one of its n−1 predecessors. A walk that comes
// back to an engine hash it passed (the engine stored a hash again as a descendant of
// itself) stops there: the chain has no n distinct blocks. Each block walked costs one
// of *budget.
func (a *Applier) deviceChain(rank int, engine uint64, n int, dst []uint64, budget *int) (out []uint64, salt uint64, salted, ok bool) {
	for k, s := range a.sources {
		if k.rank != rank || s.use != tierHeld {
			continue
		}
		last, salt, salted, found := s.block(engine)
		if !found {
			continue
		}
		*budget--
		dst = append(dst[:0], last)
		if n > 1 {
			a.walked = emptied(a.walked)
			a.walked[engine] = struct{}{}
		}
		for e := engine; len(dst) < n; {
			if e, found = s.parentEngine(e); !found {
				break
			}
			if _, again := a.walked[e]; again {
				break
			}
			a.walked[e] = struct{}{}
			var o uint64
			if o, _, _, found = s.block(e); !found {
				break
			}
			*budget--
			dst = append(dst, o)
		}
		if len(dst) < n {
			continue // another source (a cache group) may know the predecessors
		}
		slices.Reverse(dst)
		return dst, salt, salted, true
	}
	return dst[:0], 0, false, false
}

// bound keeps use's engine-hash maps within their bound, after a store. The held
// tiers' are cleared whole: an engine that stores without removing is broken. The
// offload tiers' first lose the mappings of blocks the index no longer holds (its
// offloaded part is an LRU of its own; engines such as in-process LMCache never send
// removals), and are cleared only if that is not enough.
func (a *Applier) bound(use tierUse) {
	if a.size(use) <= a.limit(use) {
		return
	}
	if use == tierOffloaded && a.prune() {
		return
	}
	a.log.Warn("kv events: engine-hash map over its bound; clearing", "tiers", use.String(), "entries", a.entries[use], "bound", a.limit(use))
	if use == tierHeld {
		a.clearAll(reasonOverflow)
		return
	}
	a.metrics.reset(a.spec.Name, reasonOverflow)
	a.drop(func(_ sourceKey, s *source) bool { return s.use == use })
}

// prune unmaps the offload tiers' engine hashes whose blocks (a chunk's last) the
// index evicted, and reports whether the maps are then within their bound with room
// to grow (three quarters of it), so pruning is not repeated at every store.
func (a *Applier) prune() bool {
	for _, s := range a.sources {
		if s.use != tierOffloaded {
			continue
		}
		engines, last := make([]uint64, 0, len(s.own)), make([]uint64, 0, len(s.own))
		for e, o := range s.own {
			engines, last = append(engines, e), append(last, o)
		}
		held := make([]bool, len(last))
		a.idx.OffloadedHeld(a.spec.Name, last, held)
		pruned := 0
		for i, e := range engines {
			if !held[i] {
				a.unmap(s, e, last[i])
				pruned++
			}
		}
		a.metrics.prune(a.spec.Name, pruned)
	}
	a.forget(tierOffloaded)
	return a.size(tierOffloaded) <= a.limit(tierOffloaded)*3/4
}

// size is use's blocks as the index counts them: each own block once.
func (a *Applier) size(use tierUse) int {
	if refs := a.refs[use]; refs != nil {
		return len(refs)
	}
	return a.entries[use]
}

// drop forgets the sources that match, and takes their blocks out of each use's index
// where no other source of that use maps them.
func (a *Applier) drop(match func(sourceKey, *source) bool) {
	for k, s := range a.sources {
		if !match(k, s) {
			continue
		}
		for engine, own := range s.own {
			a.unmap(s, engine, own)
		}
		delete(a.sources, k)
	}
	a.forget(tierHeld)
	a.forget(tierOffloaded)
}

// store adds blocks (own hashes, in chain order) to use's index.
func (a *Applier) store(use tierUse, own []uint64) {
	add := a.idx.BlockStored
	if use == tierOffloaded {
		add = a.idx.OffloadStored
	}
	if err := add(a.spec.Name, own); err != nil {
		a.log.Debug("kv events: store", "error", err)
	}
}

// forget removes from use's index the blocks a.gone[use] holds.
func (a *Applier) forget(use tierUse) {
	gone := a.gone[use]
	if len(gone) == 0 {
		return
	}
	remove := a.idx.BlockRemoved
	if use == tierOffloaded {
		remove = a.idx.OffloadRemoved
	}
	if err := remove(a.spec.Name, gone); err != nil {
		a.log.Debug("kv events: remove", "error", err)
	}
	a.gone[use] = gone[:0]
}

// cacheSalt returns the cache salt of a sequence's first block: SGLang's named field,
// or vLLM's extra key on block 0 that is not the LoRA name.
func (a *Applier) cacheSalt(ev *Event) string {
	if ev.CacheSalt != "" {
		return ev.CacheSalt
	}
	if len(ev.ExtraKeys) == 0 {
		return ""
	}
	loraSeen := false
	for _, s := range ev.ExtraKeys[0].Strings {
		if s == ev.LoRAName && !loraSeen && ev.LoRAName != "" {
			loraSeen = true
			continue
		}
		return s
	}
	return ""
}

// mapBlock maps an engine hash to the blocks it names in kvroute's: one, or for an
// engine block coarser than kvroute's, several in chain order (own; the last continues
// the chain).
func (a *Applier) mapBlock(src *source, engine uint64, own []uint64, salt uint64, salted bool) {
	last := own[len(own)-1]
	if old, ok := src.own[engine]; ok {
		if old == last {
			return
		}
		// The engine reused a hash for other tokens: the old blocks are gone.
		a.unmap(src, engine, old)
	}
	if len(own) > 1 && a.refs[src.use] == nil {
		// Chunks of prompts that differ inside one share its leading blocks, even within
		// one source: count the mappings to each block from here on.
		a.countRefs(src.use)
	}
	a.entries[src.use] += len(own)
	delete(src.tomb, engine)
	src.own[engine] = last
	if len(own) > 1 {
		if src.spans == nil {
			src.spans = map[uint64][]uint64{}
		}
		src.spans[engine] = slices.Clone(own[:len(own)-1])
	}
	if salted {
		src.salts[engine] = salt
	} else {
		delete(src.salts, engine)
	}
	if refs := a.refs[src.use]; refs != nil {
		for _, o := range own {
			refs[o]++
		}
	}
}

// unmap drops an engine hash's mapping (last, its chain's block, and the blocks before
// it in a coarse block) and queues each block no other mapping of the use holds to
// leave the index.
func (a *Applier) unmap(src *source, engine, last uint64) {
	span := src.spans[engine]
	delete(src.own, engine)
	delete(src.spans, engine)
	delete(src.salts, engine)
	delete(src.parents, engine)
	a.entries[src.use] -= 1 + len(span)
	for _, o := range span {
		if a.unref(src.use, o) {
			a.gone[src.use] = append(a.gone[src.use], o)
		}
	}
	if a.unref(src.use, last) {
		a.gone[src.use] = append(a.gone[src.use], last)
	}
}

func (a *Applier) removed(rank int, ev *Event) string {
	tier := TierOf(ev.Medium)
	if a.cfg.use(tier) == tierIgnored {
		return outcomeOtherTier
	}
	src, live := a.sources[sourceKey{rank, tier, ev.GroupIdx}]
	if _, skipped := a.skipped[groupKey{rank, ev.GroupIdx}]; skipped && !live {
		// Nothing of that group was indexed. One that holds blocks (stored without a
		// kind, as older engines send them) loses them whatever it was called.
		return outcomeNotIndexable
	}
	if ev.Malformed != "" {
		// A removal that cannot be read leaves entries the engine no longer has.
		a.clearRank(rank, reasonMalformed)
		return outcomeMalformed
	}
	if !live {
		return outcomeApplied
	}
	for _, h := range ev.BlockHashes {
		own, ok := src.own[h]
		if !ok {
			continue
		}
		salt, salted := src.salts[h]
		parent, hasParent := src.parents[h]
		src.bury(h, tombstone{own: own, salt: salt, salted: salted, parent: parent, hasParent: hasParent})
		a.unmap(src, h, own)
	}
	a.forget(src.use)
	return outcomeApplied
}

// markGroup records what a BlockStored said of a rank's cache group: whether it can be
// indexed. Past maxGroups groups of one rank that cannot, more are not recorded (their
// removals, of blocks never indexed, are then counted applied).
func (a *Applier) markGroup(g groupKey, indexable bool) {
	if indexable {
		delete(a.skipped, g)
		return
	}
	if _, ok := a.skipped[g]; ok {
		return
	}
	n := 0
	for other := range a.skipped {
		if other.rank == g.rank {
			n++
		}
	}
	if n < maxGroups {
		a.skipped[g] = struct{}{}
	}
}

// unref drops one mapping to own among use's sources and reports whether none is left
// (the block left that use's index). Without refs (one source) every mapping is the
// only one: a block another engine hash also mapped to is under-reported, never
// over-reported.
func (a *Applier) unref(use tierUse, own uint64) bool {
	refs := a.refs[use]
	if refs == nil {
		return true
	}
	n := refs[own]
	if n <= 1 {
		delete(refs, own)
		return true
	}
	refs[own] = n - 1
	return false
}

// maxGroups bounds the cache groups of one rank and tier that have a source: a hybrid
// model has a few groups that can be indexed (vLLM splits layers of one kind into
// groups of equal size, so there may be several of one kind), while group_idx is the
// engine's to choose, below 65,536.
const maxGroups = 32

// source returns k's source, making it when a block of it is about to be mapped (a
// store that maps nothing makes none). Making one past maxGroups of its rank and tier
// clears the rank first (reason groups).
func (a *Applier) source(k sourceKey) *source {
	if s, ok := a.sources[k]; ok {
		return s
	}
	groups := 0
	for other := range a.sources {
		if other.rank == k.rank && other.tier == k.tier {
			groups++
		}
	}
	if groups >= maxGroups {
		a.log.Warn("kv events: blocks in more cache groups than kvroute keeps apart; clearing the rank", "rank", k.rank, "tier", k.tier.String(), "groups", maxGroups)
		a.clearRank(k.rank, reasonGroups)
	}
	use := a.cfg.use(k.tier)
	if a.refs[use] == nil {
		for _, s := range a.sources {
			if s.use == use {
				// A second source of this use (rank, tier or group): blocks may now be
				// held twice, so count the mappings to each own hash from here on. A
				// block both on device and on the host is two uses, counted apart.
				a.countRefs(use)
				break
			}
		}
	}
	s := &source{use: use, own: map[uint64]uint64{}, salts: map[uint64]uint64{}, tomb: map[uint64]tombstone{}}
	a.sources[k] = s
	return s
}

// countRefs starts counting, per own hash, the mappings to it from use's sources.
func (a *Applier) countRefs(use tierUse) {
	refs := map[uint64]uint32{}
	for _, s := range a.sources {
		if s.use != use {
			continue
		}
		for engine, own := range s.own {
			refs[own]++
			for _, o := range s.spans[engine] {
				refs[o]++
			}
		}
	}
	a.refs[use] = refs
}

// clearRank forgets what one rank reported (AllBlocksCleared, a restart, an unfillable
// gap). With one rank it clears the worker.
func (a *Applier) clearRank(rank int, reason string) {
	if a.spec.Ranks == 1 {
		a.clearAll(reason)
		return
	}
	a.metrics.reset(a.spec.Name, reason)
	a.drop(func(k sourceKey, _ *source) bool { return k.rank == rank })
	for g := range a.skipped {
		if g.rank == rank {
			delete(a.skipped, g) // a restarted engine may serve another model
		}
	}
}

// clearAll forgets everything the worker reported.
func (a *Applier) clearAll(reason string) {
	a.metrics.reset(a.spec.Name, reason)
	// New maps free what the old ones grew to; an engine may send thousands of clears
	// in one batch, and the empty ones are kept rather than made again for each.
	if len(a.sources) > 0 {
		a.sources = map[sourceKey]*source{}
	}
	if len(a.skipped) > 0 {
		a.skipped = map[groupKey]struct{}{} // a restarted engine may serve another model
	}
	a.entries, a.refs = [tierOffloaded + 1]int{}, [tierOffloaded + 1]map[uint64]uint32{}
	for use := range a.gone {
		a.gone[use] = a.gone[use][:0]
	}
	a.grain = 0 // told again at the next offload store
	if err := a.idx.AllBlocksCleared(a.spec.Name); err != nil {
		a.log.Debug("kv events: clear", "error", err)
	}
}

// reset clears what every rank of the worker reported (reason: the resets reason).
func (a *Applier) reset(reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.clearAll(reason)
}

// Silence clears the worker's event entries and engine-hash maps and puts it back in
// approximate mode, in one step under the applier's lock: a batch arriving meanwhile
// is applied after both (and turns event mode back on), never between them, where its
// blocks would sit in an approximate worker's index (reason: the resets reason).
func (a *Applier) Silence(reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.clearAll(reason)
	if err := a.idx.SetMode(a.spec.Name, index.ModeApproximate); err != nil {
		a.log.Debug("kv events: approximate mode", "error", err)
	}
}

// Entries returns the size of the worker's engine-hash maps (all ranks, groups and
// tiers).
func (a *Applier) Entries() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.entries[tierHeld] + a.entries[tierOffloaded]
}

// mix derives a block's seed from its chain's salt and its other extra keys.
func mix(salt, other uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], salt)
	binary.LittleEndian.PutUint64(b[8:], other)
	return xxh3.Hash(b[:])
}
