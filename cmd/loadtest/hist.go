package main

import (
	"math"
	"sync/atomic"
	"time"
)

// hist is a latency histogram safe for concurrent use: buckets 2.5 % wide from 1 µs to
// about 100 s, so a quantile read from it is within 2.5 % of the true value (outside
// that range, values are clamped to the end buckets). It keeps no samples, so a long run
// costs no memory per request.
type hist struct {
	counts [histBuckets]atomic.Int64
	total  atomic.Int64
	sumNs  atomic.Int64
	maxNs  atomic.Int64
}

const (
	histMin     = float64(time.Microsecond)
	histGrowth  = 1.025
	histBuckets = 750 // 1 µs × 1.025^750 ≈ 113 s
)

var logGrowth = math.Log(histGrowth)

func (h *hist) observe(d time.Duration) {
	i := 0
	if ns := float64(d); ns > histMin {
		i = min(histBuckets-1, int(math.Log(ns/histMin)/logGrowth))
	}
	h.counts[i].Add(1)
	h.total.Add(1)
	h.sumNs.Add(int64(d))
	for {
		m := h.maxNs.Load()
		if int64(d) <= m || h.maxNs.CompareAndSwap(m, int64(d)) {
			break
		}
	}
}

// count is the number of observations.
func (h *hist) count() int64 { return h.total.Load() }

// mean is the mean observation, 0 without any.
func (h *hist) mean() time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sumNs.Load() / n)
}

// max is the largest observation.
func (h *hist) max() time.Duration { return time.Duration(h.maxNs.Load()) }

// quantile returns the q-quantile (0 < q ≤ 1): the upper edge of the bucket holding it,
// so it never understates. 0 without observations.
func (h *hist) quantile(q float64) time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(n)))
	var seen int64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return min(h.max(), time.Duration(histMin*math.Pow(histGrowth, float64(i+1))))
		}
	}
	return h.max()
}
