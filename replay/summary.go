package replay

import "slices"

// Summary condenses one policy's runs over several seeds. The ratios compare each run
// with the baseline policy's run of the same seed (runs under one seed face the same
// workload), then summarise over seeds: the mean and the worst (largest) ratio.
type Summary struct {
	Policy string
	Seeds  int
	// MovedMin and MovedMax bound the moved turns over seeds.
	MovedMin, MovedMax int
	// RecomputedMean is the mean of recomputed prefill tokens over seeds.
	RecomputedMean float64
	// HitRatioMean is the mean cache hit ratio.
	HitRatioMean float64
	// Per-seed ratios to the baseline; all zero when there is no baseline.
	Recomputed, ResumedP95, Makespan Ratio
	// TTFTP50 and TTFTP95 are per-seed ratios of TTFT over all requests to the baseline's.
	TTFTP50, TTFTP95 Ratio
}

// Ratio is a per-seed ratio to the baseline, summarised.
type Ratio struct {
	Mean, Worst float64
}

// Summarize groups results by policy, in first-seen order. baseline names the policy
// the ratios are taken against; its seeds must cover the others' for a ratio to count,
// and an empty or absent baseline leaves the ratios at zero.
func Summarize(results []Result, baseline string) []Summary {
	base := map[uint64]Result{}
	for _, r := range results {
		if r.Policy == baseline {
			base[r.Seed] = r
		}
	}
	var order []string
	byPolicy := map[string][]Result{}
	for _, r := range results {
		if _, ok := byPolicy[r.Policy]; !ok {
			order = append(order, r.Policy)
		}
		byPolicy[r.Policy] = append(byPolicy[r.Policy], r)
	}
	out := make([]Summary, 0, len(order))
	for _, p := range order {
		runs := byPolicy[p]
		s := Summary{Policy: p, Seeds: len(runs), MovedMin: runs[0].MovedTurns, MovedMax: runs[0].MovedTurns}
		var recomputed, resumed, makespan, p50, p95 []float64
		for _, r := range runs {
			s.MovedMin, s.MovedMax = min(s.MovedMin, r.MovedTurns), max(s.MovedMax, r.MovedTurns)
			s.RecomputedMean += float64(r.RecomputedPrefillTokens) / float64(len(runs))
			s.HitRatioMean += r.CacheHitRatio / float64(len(runs))
			b, ok := base[r.Seed]
			if !ok {
				continue
			}
			recomputed = appendRatio(recomputed, float64(r.RecomputedPrefillTokens), float64(b.RecomputedPrefillTokens))
			resumed = appendRatio(resumed, r.ResumedTTFTP95ms, b.ResumedTTFTP95ms)
			makespan = appendRatio(makespan, r.MakespanS, b.MakespanS)
			p50 = appendRatio(p50, r.TTFTP50ms, b.TTFTP50ms)
			p95 = appendRatio(p95, r.TTFTP95ms, b.TTFTP95ms)
		}
		s.Recomputed, s.ResumedP95, s.Makespan = summarise(recomputed), summarise(resumed), summarise(makespan)
		s.TTFTP50, s.TTFTP95 = summarise(p50), summarise(p95)
		out = append(out, s)
	}
	return out
}

// appendRatio appends v/base, skipping a zero base (nothing to compare with).
func appendRatio(ratios []float64, v, base float64) []float64 {
	if base == 0 {
		return ratios
	}
	return append(ratios, v/base)
}

func summarise(ratios []float64) Ratio {
	if len(ratios) == 0 {
		return Ratio{}
	}
	var sum float64
	for _, r := range ratios {
		sum += r
	}
	return Ratio{Mean: sum / float64(len(ratios)), Worst: slices.Max(ratios)}
}
