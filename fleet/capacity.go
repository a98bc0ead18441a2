package fleet

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/router"
)

// Capacity sources, the `source` label of kvroute_worker_capacity_blocks, in order of
// precedence.
const (
	// CapacityConfig is the worker's own capacity_blocks.
	CapacityConfig = "config"
	// CapacityScraped is what the engine reports on its metrics page (vLLM's
	// num_gpu_blocks).
	CapacityScraped = "scraped"
	// CapacityDefault is index.capacity_blocks.
	CapacityDefault = "default"
)

type capacity struct {
	blocks int // 0: the index's default
	source string
}

// capacityLocked is w's capacity in force: capacity_blocks, then the scraped value,
// then the index default.
func (f *Fleet) capacityLocked(w router.Worker) capacity {
	switch {
	case w.CapacityBlocks > 0:
		return capacity{w.CapacityBlocks, CapacityConfig}
	case f.scraped[w.Name] > 0:
		return capacity{f.scraped[w.Name], CapacityScraped}
	}
	return capacity{0, CapacityDefault}
}

// SetScrapedCapacity records the KV capacity, in blocks, the engine at address reports
// for worker (0: it reports none any more). A worker without capacity_blocks gets it in
// the index at once (the cache-pressure term reads it there); a worker that has moved
// to another address, or left, ignores it.
func (f *Fleet) SetScrapedCapacity(worker, address string, blocks int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.indexLocked(worker)
	if i < 0 || f.workers[i].Address != address || f.scraped[worker] == max(blocks, 0) {
		return
	}
	before, had := f.scraped[worker]
	if blocks > 0 {
		f.scraped[worker] = blocks
	} else {
		delete(f.scraped, worker)
	}
	applied := false
	defer func() {
		if !applied {
			// The index or the subscriptions panicked taking it (the scrape's guard
			// recovers it, and the scraper reports it again): not in force yet.
			if had {
				f.scraped[worker] = before
			} else {
				delete(f.scraped, worker)
			}
		}
	}()
	if w := f.workers[i]; w.CapacityBlocks == 0 {
		_ = f.deps.Index.SetWorker(worker, f.capacityLocked(w).blocks)
		if w.KVEvents != nil && f.deps.Events != nil {
			// The engine-hash map of its events is bounded by the capacity too.
			f.deps.Events.SetWorkers(f.eventWorkersLocked(f.workers))
		}
	}
	applied = true
}

// eventWorkersLocked is workers as the KV event subscriptions see them: with the
// capacity in force (configured or scraped) as capacity_blocks, 0 for the default.
func (f *Fleet) eventWorkersLocked(workers []router.Worker) []router.Worker {
	out := make([]router.Worker, len(workers))
	for i, w := range workers {
		if c := f.capacityLocked(w); c.source != CapacityDefault {
			w.CapacityBlocks = c.blocks
		}
		out[i] = w
	}
	return out
}

func (f *Fleet) indexLocked(worker string) int {
	for i, w := range f.workers {
		if w.Name == worker {
			return i
		}
	}
	return -1
}

// Capacity returns the capacity in blocks the index uses for worker and where it came
// from (CapacityConfig, CapacityScraped, CapacityDefault); false for an unknown worker.
func (f *Fleet) Capacity(worker string) (int, string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.indexLocked(worker)
	if i < 0 {
		return 0, "", false
	}
	c := f.reportedCapacityLocked(f.workers[i])
	return c.blocks, c.source, true
}

// reportedCapacityLocked is w's capacity as Capacity and the metric report it: the index
// default written out.
func (f *Fleet) reportedCapacityLocked(w router.Worker) capacity {
	c := f.capacityLocked(w)
	if c.blocks == 0 {
		c.blocks = f.deps.DefaultCapacityBlocks
	}
	return c
}

// NewMetrics registers kvroute_worker_capacity_blocks{worker,source}, the capacity each
// worker's index entries are bounded by and where it came from, read at scrape time. A
// nil reg registers nothing.
func NewMetrics(reg prometheus.Registerer, f *Fleet) {
	if reg != nil {
		reg.MustRegister(capacityCollector{f})
	}
}

var capacityDesc = prometheus.NewDesc("kvroute_worker_capacity_blocks",
	"KV capacity in blocks the index bounds each worker's entries by, and its source: config (capacity_blocks), scraped (the engine's metrics page) or default (index.capacity_blocks).",
	[]string{"worker", "source"}, nil)

type capacityCollector struct{ f *Fleet }

func (c capacityCollector) Describe(ch chan<- *prometheus.Desc) { ch <- capacityDesc }

// Collect reads every worker's capacity in one pass under one lock (a lookup by name per
// worker would be quadratic in the workers), and sends after unlocking so a slow scrape
// does not hold up worker changes.
func (c capacityCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.f
	f.mu.Lock()
	metrics := make([]prometheus.Metric, len(f.workers))
	for i, w := range f.workers {
		inForce := f.reportedCapacityLocked(w)
		metrics[i] = prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(inForce.blocks), w.Name, inForce.source)
	}
	f.mu.Unlock()
	for _, m := range metrics {
		ch <- m
	}
}
