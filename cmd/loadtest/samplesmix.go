package main

import (
	"fmt"
	"strconv"
	"sync/atomic"
)

// A sampleClass is a group of generate streams whose requests all ask for the same
// number of parallel samples (-samples-mix), its key: single-sample rollouts beside
// GRPO groups, a fleet whose requests take different numbers of batch slots.
type sampleClass = streamGroup[int]

// maxSampleClasses bounds -samples-mix: each class keeps two histograms, and the
// report a row.
const maxSampleClasses = 16

// parseSamplesMix reads -samples-mix: comma-separated samples:streams pairs, e.g.
// "1:12,16:4" (12 streams of single samples, 4 of groups of 16). Each sample count is
// 1-maxSamples and comes once; each class has at least one stream. "" is no mix: every
// stream asks for -samples.
func parseSamplesMix(s string) ([]sampleClass, error) {
	return parseGroups("-samples-mix", "samples", "classes", maxSampleClasses, s, func(k string) (int, error) {
		samples, err := strconv.Atoi(k)
		if err != nil || samples < 1 || samples > maxSamples {
			return 0, fmt.Errorf("samples %q must be 1-%d", k, maxSamples)
		}
		return samples, nil
	})
}

// mixSequences is the sequences the classes' streams run at once, one request each:
// the batch slots they take on the fleet.
func mixSequences(classes []sampleClass) int {
	n := 0
	for _, c := range classes {
		n += c.key * c.streams
	}
	return n
}

// classMeasured is what one sample class's streams did after the warm-up.
type classMeasured struct {
	completed      atomic.Int64
	resumed, moved atomic.Int64
	ttft, latency  hist
	servedCounts   // the class's requests, by the worker that answered
}

// classReport is one sample class's outcome over the measurement.
type classReport struct {
	Samples        int     `json:"samples"`
	Streams        int     `json:"streams"`
	Requests       int64   `json:"requests"`
	RequestsPerSec float64 `json:"requests_per_second"`
	Resumed        int64   `json:"resumed_turns"`
	Moved          int64   `json:"resumed_turns_moved"`
	// PerWorker counts the class's requests each worker answered; MaxOverMean is the
	// busiest worker's count over the mean of all workers'.
	PerWorker   map[string]int64 `json:"requests_per_worker"`
	MaxOverMean float64          `json:"requests_max_over_mean"`
	TTFT        latency          `json:"ttft"`
	Latency     latency          `json:"request_latency"`
}

// classReports summarises each sample class's measurement over secs seconds, in the
// flag's order (nil without a mix).
func classReports(classes []sampleClass, m *measured, workers int, secs float64) []classReport {
	if len(classes) == 0 {
		return nil
	}
	out := make([]classReport, 0, len(classes))
	for _, c := range classes {
		cm := m.classes[c.key]
		r := classReport{Samples: c.key, Streams: c.streams, Requests: cm.completed.Load(),
			Resumed: cm.resumed.Load(), Moved: cm.moved.Load(), TTFT: summarize(&cm.ttft), Latency: summarize(&cm.latency)}
		if secs > 0 {
			r.RequestsPerSec = float64(r.Requests) / secs
		}
		r.PerWorker, r.MaxOverMean = cm.perWorker(workers)
		out = append(out, r)
	}
	return out
}
