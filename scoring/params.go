package scoring

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Params are the weights of the cost of DESIGN §3. Every number must be finite and ≥ 0.
// Their YAML form is the `policy` section of kvroute's config and the per-route overrides.
type Params struct {
	// OverlapCredit (c) is the prefill credit, in blocks, per block the worker already holds.
	OverlapCredit float64 `yaml:"overlap_credit" json:"overlap_credit"`
	// PrefillLoadScale (p) weighs the prefill term against the decode-load terms.
	PrefillLoadScale float64 `yaml:"prefill_load_scale" json:"prefill_load_scale"`
	// ActiveRequestWeight (a) charges this many blocks per request active on the worker.
	ActiveRequestWeight float64 `yaml:"active_request_weight" json:"active_request_weight"`
	// PrefixAffinityWeight (α) charges this many blocks per prompt block the worker is
	// missing, so a cache holder keeps a session until the load gap outweighs the
	// recompute.
	PrefixAffinityWeight float64 `yaml:"prefix_affinity_weight" json:"prefix_affinity_weight"`
	// CachePressureWeight (β) charges each prompt block the worker is missing in
	// proportion to how full its cache is (held / capacity blocks): new blocks on a full
	// cache displace other sessions' blocks, which will be recomputed later. It steers
	// new sessions to the workers with room, so holders evict fewer paused sessions.
	CachePressureWeight float64 `yaml:"cache_pressure_weight" json:"cache_pressure_weight"`
	// SessionAffinityWeight (σ) credits the worker that served the request's session
	// last (session affinity by header) with this many blocks per prompt block: a bias,
	// not a pin, so a larger load gap, or the worker leaving the candidates, still moves
	// the session. It keeps sessions whose prompt is rewritten (compacted history) on
	// their worker when prefix overlap cannot tell where they were.
	SessionAffinityWeight float64 `yaml:"session_affinity_weight" json:"session_affinity_weight"`
	// QueueWeight (q) charges this many blocks per request queued for its first token on
	// the worker, Q(w): the requests booked there that have not produced one (waiting
	// for a batch slot or in prefill), or, when the worker's max_num_seqs is known and
	// higher, the active requests beyond its batch slots counting this one. Each delays
	// this request's first token by about a pass, whatever the prompts' cache hits, so a
	// busy holder of a shared prefix stops winning every session.
	QueueWeight float64 `yaml:"queue_weight" json:"queue_weight"`
	// InterferenceWeight (ι) charges ι·N(w)·m blocks, m the prompt blocks the worker is
	// missing: a prefill shares passes with the requests running on the worker, so each
	// of them waits about as long as the prefill takes. The other terms price only this
	// request's own wait; this one prices what its prefill costs the decodes under way,
	// so new prompts go to workers with fewer requests running. It trades a little
	// time to first token under saturation for shorter end-to-end latency (README,
	// "The cost"). 0 (the default) leaves it out.
	InterferenceWeight float64 `yaml:"interference_weight" json:"interference_weight"`
	// PrefillHistoryWeight (ω) charges ω·H(w)/bs blocks, H(w) the worker's recent
	// prefill: the uncached prompt tokens this router booked there, each decayed by half
	// every PrefillHistoryHalfLife, and those the other replicas (peers) report booking
	// there. The other terms see only the load of the moment (P,
	// D, N); this one sees the prefill work a worker has done lately, so new prompts go
	// to the workers that computed least, which evens out the prefill each worker does
	// over time. 0 (the default) leaves it out.
	PrefillHistoryWeight float64 `yaml:"prefill_history_weight" json:"prefill_history_weight"`
	// PrefillHistoryHalfLife is H(w)'s half-life in seconds, on the ledger's clock. A
	// booking decays the worker's sum with the half-life in force for its decision;
	// 0 forgets each booking at once (H = 0).
	PrefillHistoryHalfLife float64 `yaml:"prefill_history_half_life" json:"prefill_history_half_life"`
	// LoRAWeight (λ) charges this many blocks per request that must finish on the worker
	// before a LoRA adapter request could run there: when the worker already runs its
	// max_loras other adapters, an engine passes the request over until one of them has
	// no request left (vLLM's --max-loras), which takes whole requests, not a pass. It
	// steers an adapter's requests to workers that run it or have an adapter slot free.
	// 0 leaves it out; it needs the workers' max_loras.
	LoRAWeight float64 `yaml:"lora_weight" json:"lora_weight"`
	// SharedPrefixAffinity (h) is the share, in [0, 1], of the affinity and pressure
	// charges for missing blocks that at least two requests active on another worker are
	// using: a hot shared prefix such as a system prompt. Copying it to another worker
	// serves every session placed there later, so it is not a session move; charging it
	// in full (1) piles every new session onto the prefix's holder.
	SharedPrefixAffinity float64 `yaml:"shared_prefix_affinity" json:"shared_prefix_affinity"`
	// OffloadCredit (u) is the share, in [0, 1], of a cached block's credit that a block
	// the worker holds in a slower tier (host memory, kv_events.offload_tiers) earns when
	// it continues the worker's device overlap: loading KV over PCIe costs a fraction of
	// recomputing it, so such a block is neither a hit nor a miss. It scales the overlap
	// credit of the prefill term and is taken off the affinity, pressure and
	// interference charges of the missing blocks. 0 (Dynamo's cost) prices an offloaded
	// block as missing; 1 as a device hit.
	OffloadCredit float64 `yaml:"offload_credit" json:"offload_credit"`
	// MemoryWeight (μ) charges this many blocks per block the request would wait for
	// on the worker: the blocks it needs beyond what the worker's device has left
	// beside the requests active there, max(0, D(w) + new(w) − capacity(w)). An engine
	// admits a request only when its blocks fit beside the running ones' (vLLM waits,
	// or preempts), so a worker whose device its running requests fill delays this one
	// by whole requests, not passes, whatever the cache holds. It is 0 while devices
	// hold their running requests, and needs the workers' capacity.
	MemoryWeight float64 `yaml:"memory_weight" json:"memory_weight"`
	// DisaggregateTokens is, in a fleet with prefill workers (workers[].role prefill), the
	// fewest prompt tokens the chosen decode worker must be missing for the request to
	// be prefilled on a prefill worker and its KV sent over (disaggregated prefill and
	// decode). A shorter uncached tail is computed by the decode worker itself: a prefill
	// hop costs a round trip and a KV transfer, and a resumed session on its decode
	// worker misses only its new turn. Fleets without prefill workers ignore it.
	DisaggregateTokens float64 `yaml:"disaggregate_tokens" json:"disaggregate_tokens"`
	// Temperature 0 picks the lowest cost; above 0 samples a softmax over costs
	// normalised to [0,1].
	Temperature float64 `yaml:"temperature" json:"temperature"`
	// FloorPrefill clamps the prefill term at 0, so overlap credit cannot make a worker
	// cheaper than idle.
	FloorPrefill bool `yaml:"floor_prefill" json:"floor_prefill"`
}

// DynamoParams returns the parameters that reproduce Dynamo's default KV-router cost:
// the `kv` baseline of replays.
func DynamoParams() Params {
	return Params{OverlapCredit: 1, PrefillLoadScale: 1, SharedPrefixAffinity: 1, FloorPrefill: true,
		PrefillHistoryHalfLife: DefaultPrefillHistoryHalfLife}
}

// DefaultPrefillHistoryHalfLife is prefill_history_half_life's default, in seconds: H(w)
// weighs the last minute or so of a worker's prefill, several requests of each session.
const DefaultPrefillHistoryHalfLife = 30

// DefaultParams returns kvroute's built-in default policy: what a config without a
// `policy` section gets. It is the Dynamo cost plus prefix_affinity_weight 4 (a session
// stays with its cache holder unless the load gap outweighs 4 blocks per missing block),
// cache_pressure_weight 32 (new prefixes go where the cache has room), queue_weight 64
// (a request waiting for its first token costs about a pass) and shared_prefix_affinity
// 0 (a system prompt in use does not pin new sessions to its holder) and lora_weight
// 1024 (an adapter's requests go where it runs or a slot is free) and offload_credit
// 0.75 (a block the engine would load back from host memory is worth three quarters of
// a cached one). The replay measurements behind the choice are in docs/BENCHMARKS.md.
func DefaultParams() Params {
	p := DynamoParams()
	p.PrefixAffinityWeight = 4
	p.CachePressureWeight = 32
	p.QueueWeight = 64
	p.SharedPrefixAffinity = 0
	p.LoRAWeight = 1024
	p.OffloadCredit = 0.75
	return p
}

// ReferenceBlockSize is the block size, in tokens, the default weights were chosen at
// (the simulated workers of WORKLOADS §1, and replay's default).
const ReferenceBlockSize = 64

// DefaultParamsFor returns DefaultParams for engines of blockSize-token blocks. The
// cost is counted in blocks, so a weight per block (α, β, σ) means the same per token
// at any block size, but a weight per request (queue_weight, lora_weight,
// active_request_weight) stands for a number of tokens of prefill: in blocks of 16
// (vLLM's default) the 64 blocks of queue_weight would weigh a quarter of what they do
// in the blocks of 64 they were chosen in, and a shared prefix's holder would win
// sessions again (docs/BENCHMARKS.md, "The default at vLLM's block size"). These are
// scaled by ReferenceBlockSize / blockSize, so that a request waiting for its first
// token costs about 4,096 tokens of prefill whatever the block size. blockSize ≤ 0
// gives DefaultParams.
func DefaultParamsFor(blockSize int) Params {
	p := DefaultParams()
	if blockSize <= 0 || blockSize == ReferenceBlockSize {
		return p
	}
	scale := float64(ReferenceBlockSize) / float64(blockSize)
	p.QueueWeight *= scale
	p.LoRAWeight *= scale
	p.ActiveRequestWeight *= scale
	return p
}

// MaxParam bounds every parameter. A weight is multiplied by counts of blocks and
// requests (up to about 10^6 and 10^4); beyond this bound the product can overflow to
// +Inf, and a candidate charged +Inf by one term and credited −Inf by another costs
// NaN, which no comparison orders. The replays in docs/BENCHMARKS.md use weights up to 1,024.
const MaxParam = 1e6

// FieldError is a validation error naming the offending parameter by its YAML name.
// Callers prefix the path of the section it came from, e.g. "policy.".
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

// outOfRange is the error of a parameter whose value (its text) is not finite and ≥ 0,
// or, tooLarge, above MaxParam: Validate's, and ApplyJSON's for a number past float64's
// range, which encoding/json refuses before Validate sees it.
func outOfRange(field, value string, tooLarge bool) *FieldError {
	if tooLarge {
		return &FieldError{Field: field, Problem: fmt.Sprintf("must be at most %g, got %s", float64(MaxParam), value)}
	}
	return &FieldError{Field: field, Problem: "must be finite and ≥ 0, got " + value}
}

// Validate reports the first parameter that is not finite and ≥ 0, or a share outside
// [0, 1].
func (p Params) Validate() error {
	for _, f := range p.numbers() {
		// The error takes a copy of the name: the compiler cannot tell f's name from its
		// pointer into p, and handing f.name itself to the error would move p to the
		// heap on every call, not only on the error path.
		if v := *f.value; math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > MaxParam {
			return outOfRange(strings.Clone(f.name), fmt.Sprint(v), v > MaxParam)
		}
	}
	if p.SharedPrefixAffinity > 1 {
		return &FieldError{Field: "shared_prefix_affinity", Problem: fmt.Sprintf("must be in [0, 1] (a share of the charge), got %v", p.SharedPrefixAffinity)}
	}
	if p.OffloadCredit > 1 {
		return &FieldError{Field: "offload_credit", Problem: fmt.Sprintf("must be in [0, 1] (a share of a cached block's credit), got %v", p.OffloadCredit)}
	}
	return nil
}

// numberParam is one numeric parameter: its YAML name and where it is.
type numberParam struct {
	name  string
	value *float64
}

// numbers lists the numeric parameters by YAML name, in the order Validate reports
// them: the one list Validate and Set read, so a new weight is added in one place. It
// is an array, not a slice, so listing a value's parameters allocates nothing (Validate
// runs per request for a per-route override).
func (p *Params) numbers() [16]numberParam {
	return [...]numberParam{
		{"overlap_credit", &p.OverlapCredit},
		{"prefill_load_scale", &p.PrefillLoadScale},
		{"active_request_weight", &p.ActiveRequestWeight},
		{"prefix_affinity_weight", &p.PrefixAffinityWeight},
		{"cache_pressure_weight", &p.CachePressureWeight},
		{"session_affinity_weight", &p.SessionAffinityWeight},
		{"queue_weight", &p.QueueWeight},
		{"interference_weight", &p.InterferenceWeight},
		{"prefill_history_weight", &p.PrefillHistoryWeight},
		{"prefill_history_half_life", &p.PrefillHistoryHalfLife},
		{"lora_weight", &p.LoRAWeight},
		{"shared_prefix_affinity", &p.SharedPrefixAffinity},
		{"offload_credit", &p.OffloadCredit},
		{"memory_weight", &p.MemoryWeight},
		{"disaggregate_tokens", &p.DisaggregateTokens},
		{"temperature", &p.Temperature},
	}
}

// Set sets one parameter by its YAML name from text (as in "prefix_affinity_weight=4"),
// then validates it. Unknown names and bad values are *FieldError.
func (p *Params) Set(name, value string) error {
	if name == "floor_prefill" {
		b, err := strconv.ParseBool(value)
		if err != nil {
			return &FieldError{Field: name, Problem: fmt.Sprintf("must be true or false, got %q", value)}
		}
		p.FloorPrefill = b
		return nil
	}
	var field *float64
	for _, f := range p.numbers() {
		if f.name == name {
			field = f.value
		}
	}
	if field == nil {
		return &FieldError{Field: name, Problem: "unknown parameter"}
	}
	v, err := strconv.ParseFloat(value, 64)
	if err != nil {
		return &FieldError{Field: name, Problem: fmt.Sprintf("must be a number, got %q", value)}
	}
	old := *field
	*field = v
	if err := p.Validate(); err != nil {
		*field = old
		return err
	}
	return nil
}
