package explain

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// Bounds of what a client is answered, and of each decision the ring keeps.
const (
	// MaxHeaderBytes bounds the response header's value.
	MaxHeaderBytes = 4096
	// MaxCandidates is how many candidates (the best) the header and the ring show.
	MaxCandidates = 8
	// ResponseHeader names the response header that carries the decision.
	ResponseHeader = "x-kvroute-decision"
	// MaxNameBytes bounds the model and adapter names a trace keeps: they are the
	// client's (workers configured without models take any name), up to the body limit.
	MaxNameBytes = 256
)

// Trace is one decision: the chosen worker and its candidates, best first (the chosen
// one, then the fallbacks in order). Costs are in blocks; lower is better.
type Trace struct {
	Worker  string `json:"worker"`
	Address string `json:"address"`
	// Model is the model the request ran on (the base model of a LoRA adapter), and
	// LoRA the adapter it named, if any.
	Model string `json:"model,omitempty"`
	LoRA  string `json:"lora,omitempty"`
	// LoRAUnlisted is set when no worker of the base model lists the adapter (in its
	// lora_adapters or its engine's known model list), so every one was a candidate.
	LoRAUnlisted bool `json:"lora_unlisted,omitempty"`
	// ModelUnlisted is set when no engine model list of the workers configured without
	// models names the model, so every such worker was a candidate.
	ModelUnlisted bool `json:"model_unlisted,omitempty"`
	// Objective is the GIE objective the request named (priority.header), and Priority
	// its priority (0 for one neither the cluster nor the config defines); both absent
	// when it named none. A sheddable request (below 0) had only candidates with
	// capacity.
	Objective string `json:"objective,omitempty"`
	Priority  *int   `json:"priority,omitempty"`
	// Rewrite, when set, is the model rewrite, or the model-name rewrite header, that
	// sent the request to Model.
	Rewrite *RewriteTrace `json:"rewrite,omitempty"`
	// StoredResponse, when set, says how a request naming a stored Responses API
	// response was routed: stored_worker (to the worker that stored it), unknown (no
	// such response seen) or not_candidate (its worker is not one for the request).
	StoredResponse string `json:"stored_response,omitempty"`
	// SGLangSession, when set, says with the same values how a request naming an
	// SGLang session was routed (stored_worker: to the worker whose engine opened it).
	SGLangSession string `json:"sglang_session,omitempty"`
	// PromptTokens is the prompt's length isl; Blocks its full blocks F.
	PromptTokens int `json:"prompt_tokens"`
	Blocks       int `json:"blocks"`
	// PromptEstimatedTokens, when set, is the part of PromptTokens estimated from the
	// bytes of a prompt text whose encoding stopped early (max_prompt_tokens, or the
	// tokenizer's bound on long words): the blocks are those of its first ids.
	PromptEstimatedTokens int `json:"prompt_estimated_tokens,omitempty"`
	// ContextNarrowed is set when workers were left out because the prompt's ids (with
	// its max_tokens) reach their engines' context (max_model_len); ContextExceeded when they reach every
	// candidate's, so the engine refuses the request and nothing was booked for it.
	ContextNarrowed bool `json:"context_narrowed,omitempty"`
	ContextExceeded bool `json:"context_exceeded,omitempty"`
	// PredictedCachedTokens is the chosen worker's overlap in tokens.
	PredictedCachedTokens int `json:"predicted_cached_tokens"`
	// BlocksLost is how many more leading blocks another candidate held.
	BlocksLost int `json:"blocks_lost"`
	// AllOut is set when every candidate (or every one the prompt fits: ContextNarrowed)
	// was out for health and health was ignored.
	AllOut     bool        `json:"all_out,omitempty"`
	Candidates []Candidate `json:"candidates"`
	// Omitted counts the candidates left out to keep the trace bounded.
	Omitted int `json:"omitted,omitempty"`
	// MissingTokens, in a fleet with prefill workers, is how many prompt tokens the
	// chosen (decode) worker lacks; DecodeOnly says why no prefill worker was used
	// (under_threshold, no_prefill_worker, whole_api), and Prefill is the one that was.
	MissingTokens int           `json:"missing_tokens,omitempty"`
	DecodeOnly    string        `json:"decode_only,omitempty"`
	Prefill       *PrefillTrace `json:"prefill,omitempty"`
}

// RewriteTrace is the model rewrite of a request: where its target came from, either
// the rewrite's name (the config's or an InferenceModelRewrite's) or the request header
// that named it (the model-name rewrite header, when no rewrite matched), and the model
// the client's body asked for, which the target replaced with the trace's model (or its
// adapter).
type RewriteTrace struct {
	Name   string `json:"name,omitempty"`
	Header string `json:"header,omitempty"`
	From   string `json:"from"`
}

// PrefillTrace is a disaggregated request's prefill worker and the prefill candidates,
// best first, priced by the same cost.
type PrefillTrace struct {
	Worker                string      `json:"worker"`
	Address               string      `json:"address"`
	PredictedCachedTokens int         `json:"predicted_cached_tokens"`
	Candidates            []Candidate `json:"candidates"`
	Omitted               int         `json:"omitted,omitempty"`
}

// Candidate is one candidate's inputs and weighted cost terms (DESIGN §3). Cost is
// Prefill + ActiveBlocks + NewBlocks + Requests + Affinity + Pressure + Queue + Memory +
// Interference + History + Session + LoRA.
type Candidate struct {
	Worker  string `json:"worker"`
	Address string `json:"address"`

	Overlap        int `json:"overlap"`         // ov(w), leading blocks held
	PrefillTokens  int `json:"prefill_tokens"`  // P(w)
	ActiveBlocks   int `json:"active_blocks"`   // D(w), a term of its own
	NewBlocks      int `json:"new_blocks"`      // new(w), a term of its own
	ActiveRequests int `json:"active_requests"` // N(w)
	// UnseenRequests is the part of N(w) the engine reported beyond every booking
	// (engine_metrics.unseen_requests): traffic that did not come through kvroute.
	UnseenRequests int     `json:"unseen_requests,omitempty"`
	HeldBlocks     int     `json:"held_blocks"`     // the cache footprint the index sees
	CapacityBlocks int     `json:"capacity_blocks"` // 0: unknown
	Waiting        int     `json:"waiting"`         // engine-reported queue
	KVUtilization  float64 `json:"kv_utilization"`  // engine-reported KV usage in [0,1]
	SessionWorker  bool    `json:"session_worker"`  // served the request's session last
	// IndexMode says where the index's entries for the worker came from: "events" (its
	// engine's KV events) or "approximate" (kvroute's own decisions); empty when the
	// index does not say.
	IndexMode string `json:"index_mode,omitempty"`
	// PendingRequests is W(w), booked requests without a first token; MaxNumSeqs is
	// S(w), the worker's batch slots (0: unknown); SharedBlocks is the leading run of
	// the request's blocks that two or more requests active on this worker use.
	PendingRequests int `json:"pending_requests"`
	MaxNumSeqs      int `json:"max_num_seqs"`
	SharedBlocks    int `json:"shared_blocks"`
	// SharedMissing is the missing blocks of a hot shared prefix held elsewhere, charged
	// at shared_prefix_affinity; Queued is Q(w), the requests ahead of this one for a
	// first token.
	SharedMissing int `json:"shared_missing"`
	Queued        int `json:"queued"`
	// OffloadedBlocks is o(w): the blocks after the device overlap that the worker
	// holds in host memory (kv_events.offload_tiers), credited at offload_credit.
	OffloadedBlocks int `json:"offloaded_blocks,omitempty"`
	// MaxLoRAs is L(w), the adapters the worker runs at once (0: unknown); LoRABlocked
	// is B(w), the requests to finish before the request's adapter could run there.
	MaxLoRAs    int     `json:"max_loras,omitempty"`
	LoRABlocked float64 `json:"lora_blocked,omitempty"`
	// EngineAdapters are the adapters the worker's engine said it runs or queues (its
	// scraped vllm:lora_requests_info), counted in LoRABlocked with the booked ones: the
	// first MaxEngineAdapters of them, EngineAdaptersOmitted the rest.
	EngineAdapters        []string `json:"engine_adapters,omitempty"`
	EngineAdaptersOmitted int      `json:"engine_adapters_omitted,omitempty"`

	Prefill  float64 `json:"prefill"`  // p·prefill(w)
	Requests float64 `json:"requests"` // a·N(w)
	Affinity float64 `json:"affinity"` // α·missing
	Pressure float64 `json:"pressure"` // β·missing·held/capacity
	Queue    float64 `json:"queue"`    // q·Q(w)
	// ShortBlocks is what the worker's device lacks for the request beside its active
	// requests, max(0, D + new − capacity); Memory is μ·ShortBlocks.
	ShortBlocks int     `json:"short_blocks,omitempty"`
	Memory      float64 `json:"memory,omitempty"`
	// Interference is ι·N(w)·missing: the prefill this worker would compute, times the
	// requests running there that it slows.
	Interference float64 `json:"interference"`
	// RecentPrefill is H(w), the worker's prefill history in tokens decayed to the
	// decision, this replica's and the other replicas' (peers) together; History is
	// ω·H(w)/bs (prefill_history_weight). Both are left out while the term is off.
	RecentPrefill float64 `json:"recent_prefill,omitempty"`
	History       float64 `json:"history,omitempty"`
	Session       float64 `json:"session"` // −σ·R on the session's worker
	LoRA          float64 `json:"lora"`    // λ·B(w)
	Cost          float64 `json:"cost"`
}

// MaxEngineAdapters bounds the engine's adapters a candidate's trace lists: an engine
// may name thousands, and each trace (a log line, a response header) must stay small.
const MaxEngineAdapters = 16

// MaxEngineAdapterBytes bounds the bytes of the adapter names a candidate's trace lists:
// names may be 512 bytes long, and 16 of them on each of 16 candidates made one sampled
// entry 140 KiB (MaxBuffer's bound counts on a few KiB).
const MaxEngineAdapterBytes = 1024

// firstAdapters copies the first of an engine's adapters, at most MaxEngineAdapters
// names of MaxEngineAdapterBytes in all, names included: the list is the scraper's,
// shared and replaced at each scrape, its names cut from one label value of up to
// enginemetrics.MaxScrapedLoRAs names, and a trace sampled into the ring that held a
// part of it would keep all of it alive.
func firstAdapters(names []string) []string {
	n, size := 0, 0
	for n < min(len(names), MaxEngineAdapters) && size+len(names[n]) <= MaxEngineAdapterBytes {
		size += len(names[n])
		n++
	}
	if n == 0 {
		return nil
	}
	out := make([]string, n)
	for i := range out {
		out[i] = strings.Clone(names[i])
	}
	return out
}

// candidateOf is the one place a candidate's terms enter the schema.
func candidateOf(t scoring.Terms, address, indexMode string) Candidate {
	adapters := firstAdapters(t.EngineAdapters)
	return Candidate{
		Worker: t.Worker, Address: address, IndexMode: indexMode,
		Overlap: t.Overlap, OffloadedBlocks: t.OffloadedBlocks, PrefillTokens: t.PrefillTokens, ActiveBlocks: t.ActiveBlocks, NewBlocks: t.NewBlocks,
		ActiveRequests: t.ActiveRequests, UnseenRequests: t.UnseenRequests, HeldBlocks: t.HeldBlocks, CapacityBlocks: t.CapacityBlocks,
		Waiting: t.Waiting, KVUtilization: t.KVUtilization, SessionWorker: t.SessionWorker,
		PendingRequests: t.PendingRequests, MaxNumSeqs: t.MaxNumSeqs, SharedBlocks: t.SharedBlocks,
		SharedMissing: t.SharedMissing, Queued: t.Queued, MaxLoRAs: t.MaxLoRAs, LoRABlocked: t.LoRABlocked,
		EngineAdapters:        adapters,
		EngineAdaptersOmitted: len(t.EngineAdapters) - len(adapters),
		Prefill:               t.Prefill, Requests: t.Requests, Affinity: t.Affinity, Pressure: t.Pressure, Queue: t.Queue, Session: t.Session,
		Interference: t.Interference, RecentPrefill: t.RecentPrefill, History: t.History, LoRA: t.LoRA, ShortBlocks: t.ShortBlocks, Memory: t.Memory, Cost: t.Cost,
	}
}

// Of returns the trace of a decision with its best limit candidates (0: all of them).
func Of(d *router.Decision, limit int) Trace {
	tr := Trace{
		Worker: d.Worker, Address: d.Address, Model: boundedName(d.Model), LoRA: boundedName(d.LoRA), LoRAUnlisted: d.LoRAUnlisted, ModelUnlisted: d.ModelUnlisted, PromptTokens: d.PromptTokens, PromptEstimatedTokens: d.PromptEstimatedTokens, Blocks: d.Blocks,
		ContextNarrowed: d.ContextNarrowed, ContextExceeded: d.ContextExceeded,
		PredictedCachedTokens: d.PredictedCachedTokens, BlocksLost: d.BlocksLost, AllOut: d.AllOut,
		MissingTokens: d.MissingTokens, DecodeOnly: d.DecodeOnly, StoredResponse: d.StoredResponse,
		SGLangSession: d.SGLangSession,
	}
	if d.Objective != "" {
		p := d.Priority // a copy: a sampled trace must not keep the decision alive
		tr.Objective, tr.Priority = d.Objective, &p
	}
	if d.Rewrite != "" || d.RewriteHeader != "" {
		tr.Rewrite = &RewriteTrace{Name: d.Rewrite, Header: d.RewriteHeader, From: boundedName(d.RequestedModel)}
	}
	tr.Candidates, tr.Omitted = candidatesOf(d, d.Decision, d.Address, d.FallbackAddresses, limit)
	if p := d.Prefill; p != nil {
		tr.Prefill = &PrefillTrace{Worker: p.Worker, Address: p.Address, PredictedCachedTokens: p.PredictedCachedTokens}
		tr.Prefill.Candidates, tr.Prefill.Omitted = candidatesOf(d, p.Decision, p.Address, p.FallbackAddresses, limit)
	}
	return tr
}

// boundedName returns a client's name cut to MaxNameBytes between characters, marked
// by a trailing "…" when cut.
func boundedName(s string) string {
	if len(s) <= MaxNameBytes {
		return s
	}
	n := MaxNameBytes
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// candidatesOf lists a pick's best limit candidates (0: all), the chosen one first,
// and how many were left out.
func candidatesOf(d *router.Decision, pick scoring.Decision, address string, fallbackAddresses []string, limit int) ([]Candidate, int) {
	n := len(pick.Terms)
	if limit > 0 {
		n = min(n, limit)
	}
	out := make([]Candidate, 0, n)
	if n > 0 && pick.Chosen < len(pick.Terms) {
		out = append(out, candidateOf(pick.Terms[pick.Chosen], address, d.IndexMode(pick.Worker)))
	}
	for k, i := range pick.Fallbacks {
		if len(out) == n {
			break
		}
		fallback := ""
		if k < len(fallbackAddresses) {
			fallback = fallbackAddresses[k]
		}
		if i >= 0 && i < len(pick.Terms) {
			out = append(out, candidateOf(pick.Terms[i], fallback, d.IndexMode(pick.Terms[i].Worker)))
		}
	}
	return out, len(pick.Terms) - len(out)
}

// HeaderValue returns a decision's trace as a response header value: compact JSON in
// ASCII, at most MaxHeaderBytes, with the best MaxCandidates candidates or fewer, the
// worst dropped first, until it fits. It fails only when even the decision without
// candidates does not fit (worker names of kilobytes).
func HeaderValue(d *router.Decision) ([]byte, error) {
	tr := Of(d, MaxCandidates)
	for {
		raw, err := json.Marshal(tr)
		if err != nil {
			return nil, fmt.Errorf("explain: %w", err)
		}
		raw = asciiJSON(raw)
		if len(raw) <= MaxHeaderBytes {
			return raw, nil
		}
		// The prefill worker's other candidates go first, then the destination's.
		switch {
		case tr.Prefill != nil && len(tr.Prefill.Candidates) > 0:
			tr.Prefill.Candidates = tr.Prefill.Candidates[:len(tr.Prefill.Candidates)-1]
			tr.Prefill.Omitted++
		case len(tr.Candidates) > 0:
			tr.Candidates = tr.Candidates[:len(tr.Candidates)-1]
			tr.Omitted++
		default:
			return nil, fmt.Errorf("explain: the decision takes %d bytes without candidates, over %d", len(raw), MaxHeaderBytes)
		}
	}
}

// asciiJSON escapes every non-ASCII character of valid JSON, and DEL, as \uXXXX, so
// the value is a plain header value whatever the worker, model and adapter names:
// json.Marshal escapes the other control characters but leaves DEL (0x7f), which a
// header value may not carry (RFC 9110 field-vchar) and clients' HTTP libraries refuse.
func asciiJSON(raw []byte) []byte {
	plain := true
	for _, b := range raw {
		if b >= utf8.RuneSelf-1 {
			plain = false
			break
		}
	}
	if plain {
		return raw
	}
	out := make([]byte, 0, len(raw)+32)
	for len(raw) > 0 {
		r, size := utf8.DecodeRune(raw)
		raw = raw[size:]
		if r < utf8.RuneSelf-1 {
			out = append(out, byte(r))
			continue
		}
		for _, unit := range utf16.Encode([]rune{r}) {
			out = fmt.Appendf(out, `\u%04x`, unit)
		}
	}
	return out
}
