package replay

import (
	"slices"
	"time"
)

// Result is one (policy, seed) run's measurements. JSON names are the replay output's.
type Result struct {
	Policy   string `json:"policy"`
	Seed     uint64 `json:"seed"`
	Requests int    `json:"requests"`
	// ResumedTurns are session turns after the first; MovedTurns those sent to another
	// worker than the session's previous turn.
	ResumedTurns int `json:"resumed_turns"`
	MovedTurns   int `json:"moved_turns"`
	// RecomputedPrefillTokens are prompt tokens not served from the chosen worker's own
	// cache at admission; PreemptionRecomputeTokens are recomputed after preemptions.
	RecomputedPrefillTokens   int     `json:"recomputed_prefill_tokens"`
	PreemptionRecomputeTokens int     `json:"preemption_recompute_tokens"`
	PromptTokens              int     `json:"prompt_tokens"`
	CacheHitRatio             float64 `json:"cache_hit_ratio"`
	NonMaxOverlapSelections   int     `json:"non_max_overlap_selections"`
	TTFTP50ms                 float64 `json:"ttft_p50_ms"`
	TTFTP95ms                 float64 `json:"ttft_p95_ms"`
	ResumedTTFTP95ms          float64 `json:"resumed_ttft_p95_ms"`
	E2EP95ms                  float64 `json:"e2e_p95_ms"`
	MakespanS                 float64 `json:"makespan_s"`
	// MaxMeanPrefillLoadRatio is the busiest worker's computed prefill tokens over the
	// mean: 1 is perfect balance.
	MaxMeanPrefillLoadRatio float64 `json:"max_mean_prefill_load_ratio"`
	// OverlapMatchRatio is the share of requests whose predicted overlap was exactly
	// what the chosen engine served from its cache at admission (the prediction capped,
	// as the engine caps its hits, to leave one prompt token to compute).
	OverlapMatchRatio float64 `json:"overlap_match_ratio"`
	// SplitRequests, with prefill workers, are the requests prefilled on one and
	// decoded on another; TransferredTokens the prompt tokens their decode workers
	// loaded rather than held.
	SplitRequests     int `json:"split_requests,omitempty"`
	TransferredTokens int `json:"transferred_tokens,omitempty"`
	// HostLoadedTokens, with a host tier (sim.Config.HostBlocks), are the prompt tokens
	// the engines loaded from host memory at admission rather than recomputed (not in
	// RecomputedPrefillTokens).
	HostLoadedTokens int `json:"host_loaded_tokens,omitempty"`
	// HeldRequests, with flow control (Config.MaxActive), are the requests held before
	// they were routed, and HeldWaitP95ms the 95th percentile of their waits (their
	// TTFT includes it).
	HeldRequests  int     `json:"held_requests,omitempty"`
	HeldWaitP95ms float64 `json:"held_wait_p95_ms,omitempty"`
}

func (rn *run) result() Result {
	res := Result{Policy: rn.cfg.Policy, Seed: rn.cfg.Seed, Requests: len(rn.records)}
	var ttft, resumedTTFT, e2e, held []time.Duration
	lastWorker := map[int]int{}
	slices.SortStableFunc(rn.records, func(a, b record) int { return a.req.ID - b.req.ID })
	bs := rn.cfg.Engine.BlockSize
	matched := 0
	for _, r := range rn.records {
		if min(r.predicted, (r.prompt-1)/bs*bs) == r.cached {
			matched++
		}
		res.PromptTokens += r.prompt
		res.RecomputedPrefillTokens += r.recomputed
		res.PreemptionRecomputeTokens += r.preempted
		res.HostLoadedTokens += r.host
		if r.split {
			res.SplitRequests++
			res.TransferredTokens += r.transfer
		}
		if r.blocksLost > 0 {
			res.NonMaxOverlapSelections++
		}
		ttft, e2e = append(ttft, r.ttft), append(e2e, r.e2e)
		if r.held > 0 {
			res.HeldRequests++
			held = append(held, r.held)
		}
		res.MakespanS = max(res.MakespanS, (r.arrival + r.e2e).Seconds())
		if r.req.Session < 0 {
			continue
		}
		if r.req.Turn > 1 {
			res.ResumedTurns++
			resumedTTFT = append(resumedTTFT, r.ttft)
			if prev, ok := lastWorker[r.req.Session]; ok && prev != r.worker {
				res.MovedTurns++
			}
		}
		lastWorker[r.req.Session] = r.worker
	}
	if len(rn.records) > 0 {
		res.OverlapMatchRatio = float64(matched) / float64(len(rn.records))
	}
	if res.PromptTokens > 0 {
		res.CacheHitRatio = 1 - float64(res.RecomputedPrefillTokens)/float64(res.PromptTokens)
	}
	res.TTFTP50ms, res.TTFTP95ms = Percentile(ttft, 50), Percentile(ttft, 95)
	res.HeldWaitP95ms = Percentile(held, 95)
	res.ResumedTTFTP95ms, res.E2EP95ms = Percentile(resumedTTFT, 95), Percentile(e2e, 95)
	// With prefill workers, the balance that matters is theirs.
	prefillers := rn.engines
	if rn.cfg.PrefillWorkers > 0 {
		prefillers = rn.engines[rn.cfg.Workers:]
	}
	total, most := 0, 0
	for _, e := range prefillers {
		total += e.PrefillTokens
		most = max(most, e.PrefillTokens)
	}
	if total > 0 {
		res.MaxMeanPrefillLoadRatio = float64(most) / (float64(total) / float64(len(prefillers)))
	}
	return res
}

// Percentile returns the nearest-rank p-th percentile of ds in milliseconds (0 for no
// samples). ds is not modified.
func Percentile(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(p/100*float64(len(s))+0.999999) - 1
	rank = min(max(rank, 0), len(s)-1)
	return float64(s[rank]) / float64(time.Millisecond)
}
