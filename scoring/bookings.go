package scoring

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Bookings is the load ledger of DESIGN §5: per worker, the prefill tokens, distinct
// active blocks, active requests and requests still waiting for a first token of the
// requests this router sent there. The zero value is not usable; call [NewBookings].
type Bookings struct {
	now func() time.Time // when an adapter's last request ended (residency)
	// residency is how long an adapter stays resident on a worker after its last
	// request there ended; 0: only while it has requests.
	residency time.Duration

	mu      sync.Mutex
	workers map[string]*workerLoad
	peers   map[string]Load // per worker, the P, N and W other routers last said they booked there
	// unseen is, per worker, the requests its engine last said it runs or queues beyond
	// this ledger's and the peers' bookings at that moment (SetEngineRequests).
	unseen map[string]int
	// peerAdapters is, per worker, the LoRA adapters other routers said are resident
	// there, with their requests booked through them.
	peerAdapters map[string]map[string]int
	// peerHistory is, per worker, the prefill history other routers last said they
	// booked there (history.go).
	peerHistory map[string]peerHistory
	// version counts changes of this ledger's own counts (see Version).
	version atomic.Uint64
}

// workerLoad is one worker's booked load.
type workerLoad struct {
	name          string
	prefillTokens int
	pending       int // requests booked that have not produced a first token
	requests      int
	blocks        map[uint64]int32       // block hash → active requests whose prompt holds it
	adapters      map[string]*adapterUse // LoRA adapter → its use; nil until one is booked
	// departed marks a worker removed while requests were still booked on it: the
	// ledger forgets it when the last of them is released.
	departed bool
	// history is the worker's prefill history as of historyAt, its last booking, made
	// with a half-life of historyHalfLife seconds (history.go).
	history         float64
	historyAt       time.Time
	historyHalfLife float64
}

func (l *workerLoad) snapshot() Load {
	return Load{PrefillTokens: l.prefillTokens, ActiveBlocks: len(l.blocks), ActiveRequests: l.requests, PendingRequests: l.pending}
}

// adapterUse is one adapter's use of a worker: its active requests, and when the last
// one that ran there ended (ran: one did). A booking moved off the worker
// ([Booking.MoveTo]) never ran there and sets neither.
type adapterUse struct {
	active  int32
	lastEnd time.Time
	ran     bool
}

// resident reports whether the adapter counts as running on the worker at now: while
// it has requests, and for residency after the last one ended.
func (u *adapterUse) resident(now time.Time, residency time.Duration) bool {
	return u != nil && (u.active > 0 || residency > 0 && now.Sub(u.lastEnd) < residency)
}

// Load is a snapshot of one worker's booked load.
type Load struct {
	// PrefillTokens is P(w).
	PrefillTokens int
	// ActiveBlocks is D(w).
	ActiveBlocks int
	// ActiveRequests is N(w).
	ActiveRequests int
	// PendingRequests is W(w): active requests without a first token yet.
	PendingRequests int
}

// NewBookings returns an empty ledger.
func NewBookings() *Bookings {
	return NewBookingsResident(0, nil)
}

// NewBookingsResident returns an empty ledger in which a LoRA adapter stays resident on a
// worker for residency after its last request there ended (its sessions' next turns
// come back), on the clock now (nil: time.Now).
func NewBookingsResident(residency time.Duration, now func() time.Time) *Bookings {
	if now == nil {
		now = time.Now
	}
	return &Bookings{workers: make(map[string]*workerLoad), now: now, residency: residency}
}

// Fill sets each candidate's PrefillTokens, ActiveBlocks, ActiveRequests,
// PendingRequests, NewBlocks and SharedBlocks for a request whose full blocks are
// blocks. NewBlocks counts the blocks after the leading run already in the worker's
// active set (new(w) = F − m(w)); SharedBlocks is the leading run that at least two
// active requests there hold. The peers' load ([Bookings.SetPeerLoad]) is added to P,
// N and W, and the engines' unseen requests ([Bookings.SetEngineRequests]) to N (and
// UnseenRequests); D, NewBlocks and SharedBlocks see this ledger's blocks only. For a
// request on LoRA adapter lora ("" for a base-model request), it also sets LoRABlocked from
// each candidate's MaxLoRAs and this ledger's adapters. It sets PrefillHistory and
// PrefillHistoryAge from this ledger's bookings, and PeerPrefillHistory and
// PeerPrefillHistoryAge from the peers' ([Bookings.SetPeerHistory]), on its clock
// (history.go).
func (b *Bookings) Fill(candidates []Candidate, blocks []uint64, lora string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// The clock is read once per decision, for the adapters' residency and the
	// workers' prefill history.
	now := b.now()
	for i := range candidates {
		c := &candidates[i]
		c.UnseenRequests = 0
		l := b.workers[c.Worker]
		l.fillHistory(c, b.peerHistory[c.Worker], now)
		if l == nil {
			c.PrefillTokens, c.ActiveBlocks, c.ActiveRequests, c.PendingRequests = 0, 0, 0, 0
			c.NewBlocks, c.SharedBlocks = len(blocks), 0
			c.LoRABlocked = b.loraBlocked(nil, c, lora, now)
			continue
		}
		matched, shared := 0, 0
		for _, h := range blocks {
			users := l.blocks[h]
			if users == 0 {
				break
			}
			if users >= 2 && shared == matched {
				shared++
			}
			matched++
		}
		c.PrefillTokens, c.ActiveBlocks, c.ActiveRequests, c.PendingRequests = l.prefillTokens, len(l.blocks), l.requests, l.pending
		c.NewBlocks, c.SharedBlocks = len(blocks)-matched, shared
		c.LoRABlocked = b.loraBlocked(l, c, lora, now)
	}
	if len(b.peers) == 0 && len(b.unseen) == 0 {
		return
	}
	for i := range candidates {
		c := &candidates[i]
		c.UnseenRequests = b.unseen[c.Worker]
		c.ActiveRequests += c.UnseenRequests
		if p, ok := b.peers[c.Worker]; ok {
			c.PrefillTokens += p.PrefillTokens
			c.ActiveRequests += p.ActiveRequests
			c.PendingRequests += p.PendingRequests
		}
	}
}

// SetEngineRequests records what a worker's engine says it runs and queues (scraped:
// vllm:num_requests_running + vllm:num_requests_waiting): the requests beyond this
// ledger's and the peers' bookings at this moment are traffic that did not come
// through kvroute (clients calling the engine directly, another gateway, replicas not
// in peers), and [Bookings.Fill] adds them to N(w) until the next call, as
// Candidate.UnseenRequests. So they take batch slots in Q(w) and count against
// max_active_requests_per_worker as booked requests do. The difference is taken here,
// under the ledger's lock, so it compares two counts of one moment; requests booked
// but not yet at the engine make it smaller, never larger. requests < 0 (no reading)
// forgets the worker's. Counts are clamped to [0, MaxPeerCount].
func (b *Bookings) SetEngineRequests(worker string, requests int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if requests < 0 {
		delete(b.unseen, worker)
		return
	}
	booked := b.peers[worker].ActiveRequests
	if l := b.workers[worker]; l != nil {
		booked += l.requests
	}
	unseen := min(max(requests-booked, 0), MaxPeerCount)
	if unseen == 0 {
		delete(b.unseen, worker)
		return
	}
	if b.unseen == nil {
		b.unseen = make(map[string]int)
	}
	b.unseen[worker] = unseen
}

// UnseenRequests returns the worker's requests its engine reported beyond the bookings
// at the last [Bookings.SetEngineRequests]; 0 when none or unknown.
func (b *Bookings) UnseenRequests(worker string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unseen[worker]
}

// loraBlocked is c's B(w) on worker load l (nil: nothing booked there) for a request
// on adapter lora, with the peers' adapters; base-model requests look nothing up.
func (b *Bookings) loraBlocked(l *workerLoad, c *Candidate, lora string, now time.Time) float64 {
	if lora == "" || c.MaxLoRAs <= 0 {
		return 0
	}
	return l.loraBlocked(lora, c.MaxLoRAs, now, b.residency, b.peerAdapters[c.Worker], c.EngineAdapters)
}

// loraBlocked is B(w) for a request on adapter lora: 0 when the adapter is resident
// here or the request, or the worker's max_loras, has none. Otherwise the request
// takes one of the worker's adapter slots, which narrows where other adapters can go:
// B is the share of the slots in use once it has (at most 1), plus, when none is free,
// the fewest requests booked on one of the resident adapters (at least 1), all of which
// must finish before an engine runs another adapter. An adapter is resident while it
// has requests, and for residency after the last one ended; the peers' adapters and
// those the engine reports (engine) are resident too, each counted once.
func (l *workerLoad) loraBlocked(lora string, maxLoRAs int, now time.Time, residency time.Duration, peers map[string]int, engine []string) float64 {
	if lora == "" || maxLoRAs <= 0 {
		return 0
	}
	if _, ok := peers[lora]; ok || slices.Contains(engine, lora) {
		return 0
	}
	resident, fewest := 0, math.MaxInt
	if l != nil {
		for name, u := range l.adapters {
			if !u.resident(now, residency) {
				continue
			}
			if name == lora {
				return 0
			}
			resident++
			fewest = min(fewest, int(u.active)+peers[name])
		}
	}
	for name, n := range peers {
		if l.ownUse(name).resident(now, residency) {
			continue // counted above, with the peers' requests
		}
		resident++
		fewest = min(fewest, n)
	}
	for _, name := range engine {
		if resident >= maxLoRAs && fewest <= 1 {
			break // B is 2 whatever the rest: an engine may name thousands
		}
		if _, counted := peers[name]; counted || l.ownUse(name).resident(now, residency) {
			continue
		}
		resident++
		fewest = min(fewest, 1) // the engine runs or queues at least one of its requests
	}
	if resident < maxLoRAs {
		return float64(resident+1) / float64(maxLoRAs)
	}
	return 1 + float64(max(fewest, 1))
}

// ownUse is this ledger's use of adapter name on the worker; nil when none.
func (l *workerLoad) ownUse(name string) *adapterUse {
	if l == nil {
		return nil
	}
	return l.adapters[name]
}

// MaxPeerCount bounds each count a peer reports ([Bookings.SetPeerLoad]): peers are
// other processes, and a count near the integer maximum would wrap this router's sums
// negative. 2^31 tokens or requests is far beyond any worker.
const MaxPeerCount = 1 << 31

// SetPeerLoad records what other routers sharing the worker (other kvroute replicas)
// last reported booking there; [Bookings.Fill] adds its P, N and W to this ledger's
// own, so the cost sees load this router did not book. Its ActiveBlocks is not added:
// distinct blocks do not sum (a system prompt both routers' requests use would count
// twice and push sessions off its holder; replay measured 50–80 moved turns of 160 with
// it added). Counts are clamped to [0, MaxPeerCount]; a zero Load forgets the worker's peer
// load. [Bookings.Load], [Bookings.LoadsWithAdapters] and the metrics stay this ledger's own.
// Package peers calls it with what the other replicas report; replay's -share-interval
// with the other simulated replicas' counts.
func (b *Bookings) SetPeerLoad(worker string, l Load) {
	clamp := func(n int) int { return min(max(n, 0), MaxPeerCount) }
	// ActiveBlocks is dropped, not kept unread: a Load of blocks alone is no peer load.
	l = Load{PrefillTokens: clamp(l.PrefillTokens), ActiveRequests: clamp(l.ActiveRequests), PendingRequests: clamp(l.PendingRequests)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if l == (Load{}) {
		delete(b.peers, worker)
		return
	}
	if b.peers == nil {
		b.peers = make(map[string]Load)
	}
	b.peers[worker] = l
}

// SetPeerAdapters records the LoRA adapters other routers sharing the worker last
// said are resident there (booked, or within their lora_residency), with the requests
// booked through them (0 for one resident between requests); [Bookings.Fill] counts
// them with this ledger's own for LoRABlocked. Counts are clamped to [0,
// MaxPeerCount]; an empty map forgets the worker's. The map is copied. Package peers
// calls it with what the other replicas report.
func (b *Bookings) SetPeerAdapters(worker string, adapters map[string]int) {
	var own map[string]int
	if len(adapters) > 0 {
		own = make(map[string]int, len(adapters))
		for name, n := range adapters {
			own[name] = min(max(n, 0), MaxPeerCount)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if own == nil {
		delete(b.peerAdapters, worker)
		return
	}
	if b.peerAdapters == nil {
		b.peerAdapters = make(map[string]map[string]int)
	}
	b.peerAdapters[worker] = own
}

// LoadsWithAdapters returns every worker's booked load, this ledger's own (including
// workers with nothing booked now), and, per worker, the LoRA adapters
// resident there through this ledger's own bookings (booked, or within the residency)
// with their booked requests, from one snapshot: what package peers reports to the
// other replicas. A peer refuses a report naming more requests of an adapter than of
// the worker, so the two must not be read apart. Workers without adapters are left out
// of the second map.
func (b *Bookings) LoadsWithAdapters() (map[string]Load, map[string]map[string]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var now time.Time
	if b.residency > 0 {
		now = b.now()
	}
	loads := make(map[string]Load, len(b.workers))
	var adapters map[string]map[string]int
	for worker, l := range b.workers {
		loads[worker] = l.snapshot()
		for name, u := range l.adapters {
			if !u.resident(now, b.residency) {
				continue
			}
			if adapters == nil {
				adapters = make(map[string]map[string]int)
			}
			if adapters[worker] == nil {
				adapters[worker] = make(map[string]int)
			}
			adapters[worker][name] = int(u.active)
		}
	}
	return loads, adapters
}

// Book records a base-model request on a worker: prefillTokens (its uncached prompt
// tokens) join P and the request joins W until [Booking.PrefillDone], and its blocks
// join the active set and the request joins N until [Booking.Release]. Book retains
// blocks; the caller must not modify them.
func (b *Bookings) Book(worker string, blocks []uint64, prefillTokens int) *Booking {
	return b.BookAdapter(worker, "", blocks, prefillTokens)
}

// BookAdapter is [Bookings.Book] for a request on LoRA adapter lora ("" for the base
// model): the adapter counts as running on the worker until [Booking.Release].
// Its prefill tokens join the worker's prefill history with the default
// prefill_history_half_life ([Bookings.BookDecision] takes the one in force).
func (b *Bookings) BookAdapter(worker, lora string, blocks []uint64, prefillTokens int) *Booking {
	return b.book(worker, lora, blocks, prefillTokens, DefaultPrefillHistoryHalfLife, 1)
}

// book records a request of sequences engine sequences (at least one): each joins N,
// and W until the first token; its prompt's blocks and prefill count once.
func (b *Bookings) book(worker, lora string, blocks []uint64, prefillTokens int, historyHalfLife float64, sequences int) *Booking {
	k := &Booking{ledger: b, blocks: blocks, lora: lora, prefillTokens: max(prefillTokens, 0), historyHalfLife: historyHalfLife,
		sequences: max(sequences, 1)}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.add(k, worker)
	k.bookedAt = b.now()
	k.load.addHistory(k.prefillTokens, k.bookedAt, k.historyHalfLife)
	return k
}

// add puts k's share on worker's load. Called with b.mu held.
func (b *Bookings) add(k *Booking, worker string) {
	l := b.workers[worker]
	if l == nil {
		l = &workerLoad{name: worker, blocks: make(map[uint64]int32)}
		b.workers[worker] = l
	}
	k.load = l
	l.departed = false // back in the fleet, with what it still runs
	if !k.prefillDone {
		l.prefillTokens += k.prefillTokens
		l.pending += k.sequences
	}
	l.requests += k.sequences
	b.version.Add(1)
	for _, h := range k.blocks {
		l.blocks[h]++
	}
	if k.lora != "" {
		if l.adapters == nil {
			l.adapters = make(map[string]*adapterUse)
		}
		u := l.adapters[k.lora]
		if u == nil {
			u = &adapterUse{}
			l.adapters[k.lora] = u
		}
		u.active++
	}
}

// Load returns a worker's booked load; an unknown worker has none.
func (b *Bookings) Load(worker string) Load {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.workers[worker]
	if l == nil {
		return Load{}
	}
	return l.snapshot()
}

// Version counts the changes of this ledger's own P, N and W (bookings, first tokens,
// releases), not the peers': a reader that saw the same version twice saw the same
// [Bookings.LoadsWithAdapters] (but for an adapter's residency ending in between).
// Package peers sends its report to the other replicas when it moves.
func (b *Bookings) Version() uint64 { return b.version.Load() }

// RemoveWorker forgets a worker that left the fleet. Requests still booked on it keep
// counting (they still run there, and [Bookings.Load] says so) until they are
// released, and then the ledger holds nothing of it: worker names that come and go do
// not accumulate. A worker booked again before that is back, with what it still runs.
// Its peer load stays until the peers withdraw it ([Bookings.SetPeerLoad] with a zero
// Load, when no peer reports the worker): package peers gives a sum only when it
// changes, so a worker back in the fleet would otherwise go without its peers' load.
// It is read only for workers in the fleet. Its engine's unseen requests
// ([Bookings.SetEngineRequests]) are forgotten at once.
func (b *Bookings) RemoveWorker(worker string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.unseen, worker) // its engine's word goes with it
	l := b.workers[worker]
	if l == nil {
		return
	}
	if l.requests == 0 {
		delete(b.workers, worker)
		return
	}
	l.departed = true
}

// DetachWorker starts worker anew in the ledger: its address changed, so another
// engine runs under its name, which runs none of the old one's requests and holds none
// of its adapters. The requests still booked on the old engine stay booked on a load of
// their own, which their releases drain and which nothing reports or charges.
func (b *Bookings) DetachWorker(worker string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.unseen, worker) // the old engine's word
	if l := b.workers[worker]; l != nil {
		delete(b.workers, worker)
		b.version.Add(1)
	}
}

// Booking is one request's share of a worker's load. Its methods are idempotent and
// safe for concurrent use.
type Booking struct {
	ledger        *Bookings
	load          *workerLoad
	blocks        []uint64
	lora          string // the request's adapter; "" for the base model
	prefillTokens int
	// sequences is how many engine sequences the request runs (its parallel samples and
	// batch prompts): each counts in N, and in W until the first token.
	sequences int
	// bookedAt is when prefillTokens joined the worker's prefill history, decayed
	// with historyHalfLife (seconds): what MoveTo takes back.
	bookedAt        time.Time
	historyHalfLife float64
	prefillDone     bool // guarded by ledger.mu
	released        bool // guarded by ledger.mu
}

// PrefillDone ends the request's share of P and W, at its first token. Calls after the
// first, or after Release, do nothing.
func (k *Booking) PrefillDone() {
	k.ledger.mu.Lock()
	defer k.ledger.mu.Unlock()
	k.endPrefill()
}

// Release ends the request's whole booking, at completion, cancel or error. Calls after
// the first do nothing. It reports whether this call released the booking.
func (k *Booking) Release() bool {
	k.ledger.mu.Lock()
	defer k.ledger.mu.Unlock()
	if k.released {
		return false
	}
	k.remove(true)
	k.released = true
	return true
}

// Cancel ends a booking whose request was never sent (its decision failed after
// booking): as Release, and its prefill leaves the worker's prefill history, which no
// engine computed. Calls after the first, or after Release, do nothing. It reports
// whether this call ended the booking.
func (k *Booking) Cancel() bool {
	k.ledger.mu.Lock()
	defer k.ledger.mu.Unlock()
	if k.released {
		return false
	}
	k.load.removeHistory(k.prefillTokens, k.bookedAt, k.ledger.now(), k.historyHalfLife)
	k.remove(false) // it never ran: an adapter's residency stays as the others made it
	k.released = true
	return true
}

// MoveTo moves the booking to worker, whose engine serves the request instead (a
// data plane's fallback), with prefillTokens as its share of P until
// [Booking.PrefillDone] (none once that was called). The booking stays one: its
// Release frees it on worker. It reports whether it moved; a released booking, or one
// already on worker, does not.
func (k *Booking) MoveTo(worker string, prefillTokens int) bool {
	k.ledger.mu.Lock()
	defer k.ledger.mu.Unlock()
	if k.released || k.load.name == worker {
		return false
	}
	prefillDone := k.prefillDone
	now := k.ledger.now()
	// The fallback computed the prompt, whenever its first token came: the prefill
	// history moves with the request.
	k.load.removeHistory(k.prefillTokens, k.bookedAt, now, k.historyHalfLife)
	k.remove(false) // ends the prefill on the old worker, where the request never ran
	k.prefillDone, k.prefillTokens = prefillDone, max(prefillTokens, 0)
	k.ledger.add(k, worker)
	k.bookedAt = now
	k.load.addHistory(k.prefillTokens, now, k.historyHalfLife)
	return true
}

// remove takes k's share off its worker's load; ran says whether the request ran
// there (Release) or moved away (MoveTo). Called with the ledger's lock held.
func (k *Booking) remove(ran bool) {
	k.endPrefill()
	k.ledger.version.Add(1)
	k.load.requests -= k.sequences
	for _, h := range k.blocks {
		if n := k.load.blocks[h] - 1; n > 0 {
			k.load.blocks[h] = n
		} else {
			delete(k.load.blocks, h)
		}
	}
	if k.lora != "" {
		k.ledger.endAdapter(k.load, k.lora, ran)
	}
	if k.load.departed && k.load.requests == 0 && k.ledger.workers[k.load.name] == k.load {
		delete(k.ledger.workers, k.load.name)
	}
}

// endAdapter ends one request of adapter lora on l. The adapter stays resident for
// the ledger's residency after the last request that ran there (ran) ended; one that
// moved away leaves the residency as the others made it, and none at all when none
// ran there. Adapters past it are forgotten here, so a worker's map holds at most the
// adapters used within the residency.
func (b *Bookings) endAdapter(l *workerLoad, lora string, ran bool) {
	u := l.adapters[lora]
	u.active--
	if b.residency == 0 {
		if u.active == 0 {
			delete(l.adapters, lora)
		}
		return
	}
	var now time.Time
	if ran {
		// Even with others still active: should they all move away, residency counts
		// from this end.
		now = b.now()
		u.lastEnd, u.ran = now, true
	}
	if u.active > 0 {
		return
	}
	if !u.ran {
		delete(l.adapters, lora)
		return
	}
	if !ran {
		now = b.now()
	}
	for name, other := range l.adapters {
		if !other.resident(now, b.residency) {
			delete(l.adapters, name)
		}
	}
}

func (k *Booking) endPrefill() {
	if k.prefillDone || k.released {
		return
	}
	k.prefillDone = true
	k.load.prefillTokens -= k.prefillTokens
	k.load.pending -= k.sequences
	k.ledger.version.Add(1)
}
