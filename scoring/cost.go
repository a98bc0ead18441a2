package scoring

import (
	"math"
	"time"
)

// Request is what a [Picker] knows of a request: its size and its prompt's blocks.
type Request struct {
	// PromptTokens is the prompt length isl in tokens.
	PromptTokens int
	// BlockSize is the engine's KV block size bs in tokens; it must be positive.
	BlockSize int
	// Blocks are the chained hashes of the prompt's full blocks (F of them). The picker
	// does not modify or retain them.
	Blocks []uint64
	// Params, when not nil, replaces the [KVCost] picker's parameters for this request
	// only (a per-route override). It must be valid.
	Params *Params
	// SharedPrefixBlocks is the longest leading run of the request's blocks that at
	// least two requests active on one candidate are using (the largest
	// Candidate.SharedBlocks): a hot shared prefix. [KVCost.Pick] sets it from the
	// candidates; a caller of [Params.Cost] sets it itself.
	SharedPrefixBlocks int
}

// promptBlocks returns R = ceil(isl/bs), the blocks the prompt occupies.
func (r *Request) promptBlocks() int {
	return (r.PromptTokens + r.BlockSize - 1) / r.BlockSize
}

// Candidate is one eligible worker with the inputs of its cost (DESIGN §3).
type Candidate struct {
	// Worker names the worker.
	Worker string
	// Overlap is ov(w): leading full blocks of the request the worker holds on device.
	Overlap int
	// OffloadedBlocks is o(w): the blocks right after the device overlap that the
	// worker holds in a slower tier (host memory), as a run continuing it: the engine
	// loads them instead of computing them. Each earns OffloadCredit of a cached
	// block's credit.
	OffloadedBlocks int
	// PrefillTokens is P(w): uncached prompt tokens of requests booked on the worker
	// that have not produced their first token.
	PrefillTokens int
	// ActiveBlocks is D(w): distinct blocks in the prompts of requests active on the worker.
	ActiveBlocks int
	// NewBlocks is new(w): the request's full blocks not already in the worker's active set.
	NewBlocks int
	// ActiveRequests is N(w): requests active on the worker, booked by this router or
	// its peers, plus UnseenRequests.
	ActiveRequests int
	// UnseenRequests is the part of N(w) the worker's engine reported beyond every
	// booking at its last scrape: traffic that did not come through kvroute
	// ([Bookings.SetEngineRequests]).
	UnseenRequests int
	// PendingRequests is W(w): requests booked on the worker that have not produced
	// their first token (waiting for a batch slot or in prefill).
	PendingRequests int
	// SharedBlocks is the leading run of the request's blocks that at least two
	// requests active on the worker are using.
	SharedBlocks int
	// MaxNumSeqs is S(w), the worker's batch slots (its max_num_seqs); 0 means unknown.
	MaxNumSeqs int
	// MaxLoRAs is L(w), how many LoRA adapters the worker runs at once (its max_loras); 0
	// means unknown. LoRABlocked is B(w): for an adapter request, the requests that must
	// finish before its adapter could run on the worker (0 when it runs there already or
	// a slot is free; else the fewest requests of one of the L adapters it runs).
	MaxLoRAs    int
	LoRABlocked float64
	// EngineAdapters are the LoRA adapters the worker's engine says it runs or queues
	// requests of (vLLM's running_lora_adapters and waiting_lora_adapters, scraped),
	// filled for an adapter request; [Bookings.Fill] counts them as running there with
	// the ledger's own and the peers', each with at least one request.
	EngineAdapters []string
	// EngineLoRA is what the worker's engine says of the request's adapter, for the GIE
	// baseline's LoRA-affinity score; LoRAUnknown when it says nothing. The kv cost
	// does not read it.
	EngineLoRA LoRAState
	// Waiting and KVUtilization are what the engine itself reports (queued requests and
	// the share of KV blocks in use, scraped or simulated); zero when unknown. The kv
	// cost does not use them; the GIE baseline does.
	Waiting       int
	KVUtilization float64
	// HeldBlocks and CapacityBlocks are the worker's cache footprint as the index sees
	// it: blocks recently recorded or reported there, and its capacity in blocks. Zero
	// capacity means unknown, and the cache-pressure term is then 0.
	HeldBlocks, CapacityBlocks int
	// SessionWorker reports that the worker served the request's session last (the
	// session header's value, remembered by the router).
	SessionWorker bool
	// PrefillHistory is the worker's recent prefill as of its last booking: the
	// uncached prompt tokens booked there by this router, each decayed by half every
	// prefill_history_half_life up to that booking. PrefillHistoryAge is the time since
	// that booking; the cost decays the sum over it ([Bookings.Fill] sets both).
	PrefillHistory    float64
	PrefillHistoryAge time.Duration
	// PeerPrefillHistory is the other replicas' prefill history on the worker, summed,
	// as of PeerPrefillHistoryAge ago (package peers; [Bookings.SetPeerHistory]): the
	// cost decays it over its age as it does PrefillHistory, and H(w) is the sum.
	PeerPrefillHistory    float64
	PeerPrefillHistoryAge time.Duration
}

// LoRAState is an engine's state for one LoRA adapter, as vLLM's
// vllm:lora_requests_info reports it (running and waiting adapters, max_lora).
type LoRAState uint8

// LoRA states, from the best place for the adapter's next request to the worst.
const (
	LoRAUnknown  LoRAState = iota // not reported, or a base-model request
	LoRARunning                   // the adapter runs there
	LoRASlotFree                  // it does not, and fewer than max_lora adapters run or wait
	LoRAQueued                    // requests of it wait there for a slot
	LoRAFull                      // none of it, and every slot taken
)

// Terms is one candidate's cost split into its weighted terms, in blocks. Cost is their
// sum: Prefill + ActiveBlocks + NewBlocks + Requests + Affinity + Pressure + Queue +
// Memory + Interference + History + Session + LoRA.
type Terms struct {
	Candidate
	// Prefill is p·prefill(w), prefill(w) = (P + isl)/bs − c·(ov + u·o), clamped at 0
	// when FloorPrefill is set.
	Prefill float64
	// Requests is a·N(w).
	Requests float64
	// Affinity is α·m, the charge for prompt blocks the worker is missing, with m =
	// max(0, R − ov) − (1 − h)·SharedMissing − u·o (+ the overlap of the two
	// discounts, so a block both shared and offloaded gets the larger one): the blocks
	// of a hot shared prefix count at the share h, offloaded ones at 1 − u.
	Affinity float64
	// Pressure is β·m·held/capacity: the missing blocks priced by how full the worker's
	// cache already is.
	Pressure float64
	// Session is −σ·R for the session's last worker, 0 for the others: a credit.
	Session float64
	// SharedMissing counts the missing blocks that are a hot shared prefix on another
	// worker: min(R − ov, SharedPrefixBlocks − ov), at least 0.
	SharedMissing int
	// Queued is Q(w) = max(W, N + 1 − S): requests that would be ahead of this one, or
	// it itself, waiting for a first token (N + 1 − S only when S is known).
	Queued int
	// LoadCredit is u·o(w): the offloaded blocks counted as cached, in blocks.
	LoadCredit float64
	// Queue is q·Q(w).
	Queue float64
	// ShortBlocks is what the worker's device lacks for the request beside the
	// requests active there: max(0, D(w) + new(w) − capacity(w)), 0 when the capacity
	// is unknown. Memory is μ·ShortBlocks.
	ShortBlocks int
	Memory      float64
	// Interference is ι·N(w)·(max(0, R − ov) − u·o): the prompt blocks this worker
	// would compute (a loaded block counting 1 − u), times the requests active on it,
	// whose passes that prefill lengthens.
	Interference float64
	// RecentPrefill is H(w), the worker's prefill history decayed to the decision, this
	// router's and its peers': PrefillHistory·2^(−PrefillHistoryAge/half-life) +
	// PeerPrefillHistory·2^(−PeerPrefillHistoryAge/half-life), in tokens. History is
	// ω·H(w)/bs. Both are 0 when prefill_history_weight is 0 (the history is not read).
	RecentPrefill float64
	History       float64
	// LoRA is λ·B(w): the requests to wait for before the request's adapter can run.
	LoRA float64
	// Cost is the candidate's total cost; lower is better.
	Cost float64
}

// Cost prices one candidate for a request. It is the only implementation of the cost of
// DESIGN §3; the server, the simulator and replays all reach it through [KVCost].
func (p Params) Cost(req *Request, c Candidate) Terms {
	bs := float64(req.BlockSize)
	// R is 0 for an empty prompt, so an empty prompt pays no affinity or pressure.
	blocks := req.promptBlocks()
	missing := max(0, blocks-c.Overlap)
	// Offloaded blocks continue the device run, so at most the missing ones.
	offloaded := min(missing, max(0, c.OffloadedBlocks))
	loadCredit := p.OffloadCredit * float64(offloaded)
	prefill := float64(c.PrefillTokens+req.PromptTokens)/bs - p.OverlapCredit*(float64(c.Overlap)+loadCredit)
	if p.FloorPrefill {
		prefill = math.Max(prefill, 0)
	}
	shared := min(missing, max(0, req.SharedPrefixBlocks-c.Overlap))
	// Both discounts start at the device overlap, so min(shared, offloaded) blocks get
	// both; each keeps only the larger.
	sharedDiscount := 1 - p.SharedPrefixAffinity
	both := float64(min(shared, offloaded)) * min(sharedDiscount, p.OffloadCredit)
	charged := float64(missing) - sharedDiscount*float64(shared) - loadCredit + both
	computed := float64(missing) - loadCredit
	queued := c.PendingRequests
	if c.MaxNumSeqs > 0 {
		queued = max(queued, c.ActiveRequests+1-c.MaxNumSeqs)
	}
	t := Terms{
		Candidate:     c,
		Prefill:       p.PrefillLoadScale * prefill,
		Requests:      p.ActiveRequestWeight * float64(c.ActiveRequests),
		Affinity:      p.PrefixAffinityWeight * charged,
		SharedMissing: shared,
		Queued:        queued,
		Queue:         p.QueueWeight * float64(queued),
		Interference:  p.InterferenceWeight * float64(c.ActiveRequests) * computed,
		LoRA:          p.LoRAWeight * c.LoRABlocked,
		LoadCredit:    loadCredit,
	}
	if c.CapacityBlocks > 0 {
		t.ShortBlocks = max(0, c.ActiveBlocks+c.NewBlocks-c.CapacityBlocks)
		t.Memory = p.MemoryWeight * float64(t.ShortBlocks)
		t.Pressure = p.CachePressureWeight * charged * min(1, float64(c.HeldBlocks)/float64(c.CapacityBlocks))
	}
	if c.SessionWorker {
		t.Session = -p.SessionAffinityWeight * float64(blocks)
	}
	if p.PrefillHistoryWeight > 0 {
		t.RecentPrefill = decayed(c.PrefillHistory, c.PrefillHistoryAge, p.PrefillHistoryHalfLife) +
			decayed(c.PeerPrefillHistory, c.PeerPrefillHistoryAge, p.PrefillHistoryHalfLife)
		t.History = p.PrefillHistoryWeight * t.RecentPrefill / bs
	}
	t.Cost = t.Prefill + float64(c.ActiveBlocks) + float64(c.NewBlocks) + t.Requests + t.Affinity + t.Pressure + t.Queue + t.Memory +
		t.Session + t.Interference + t.History + t.LoRA
	return t
}
