package fleet

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
)

// capacityOf reads the index's capacity for a worker.
func capacityOf(t *testing.T, idx *index.Index, worker string) int {
	t.Helper()
	held, capacity := make([]int, 1), make([]int, 1)
	idx.Footprints([]string{worker}, held, capacity)
	return capacity[0]
}

func TestCapacityPrecedenceConfigThenScrapedThenDefault(t *testing.T) {
	idx, err := index.New(index.Config{CapacityBlocks: 100}, nil)
	require.NoError(t, err)
	rec := &recorder{}
	configured := router.Worker{Name: "configured", Address: "10.0.0.1:8000", CapacityBlocks: 50}
	scraped := router.Worker{Name: "scraped", Address: "10.0.0.2:8000"}
	f, err := New([]router.Worker{configured, scraped}, Deps{Index: idx, Router: rec, DefaultCapacityBlocks: 100})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	NewMetrics(reg, f)

	assert.Equal(t, 100, capacityOf(t, idx, "scraped"), "the index default until the engine says")
	f.SetScrapedCapacity("scraped", "10.0.0.2:8000", 2048)
	f.SetScrapedCapacity("configured", "10.0.0.1:8000", 4096)
	assert.Equal(t, 2048, capacityOf(t, idx, "scraped"), "the index takes the scraped value at once")
	assert.Equal(t, 50, capacityOf(t, idx, "configured"), "capacity_blocks wins over the engine's")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_worker_capacity_blocks KV capacity in blocks the index bounds each worker's entries by, and its source: config (capacity_blocks), scraped (the engine's metrics page) or default (index.capacity_blocks).
# TYPE kvroute_worker_capacity_blocks gauge
kvroute_worker_capacity_blocks{source="config",worker="configured"} 50
kvroute_worker_capacity_blocks{source="scraped",worker="scraped"} 2048
`), "kvroute_worker_capacity_blocks"))

	f.SetScrapedCapacity("scraped", "10.0.0.9:8000", 8) // a late reading from another address
	assert.Equal(t, 2048, capacityOf(t, idx, "scraped"), "a reading for an address the worker no longer has is ignored")
	f.SetScrapedCapacity("gone", "10.0.0.3:8000", 8)
	_, _, ok := f.Capacity("gone")
	assert.False(t, ok)

	// Another engine behind the worker: back to the default until it is scraped.
	_, err = f.Apply([]router.Worker{configured, {Name: "scraped", Address: "10.0.0.5:8000"}})
	require.NoError(t, err)
	blocks, source, _ := f.Capacity("scraped")
	assert.Equal(t, []any{100, CapacityDefault}, []any{blocks, source})
	assert.Equal(t, 100, capacityOf(t, idx, "scraped"))

	f.SetScrapedCapacity("scraped", "10.0.0.5:8000", 512)
	f.SetScrapedCapacity("scraped", "10.0.0.5:8000", 0) // the engine stopped reporting one
	blocks, source, _ = f.Capacity("scraped")
	assert.Equal(t, []any{100, CapacityDefault}, []any{blocks, source})

	// capacity_blocks removed from the config: the scraped value applies.
	f.SetScrapedCapacity("configured", "10.0.0.1:8000", 4096)
	_, err = f.Apply([]router.Worker{{Name: "configured", Address: "10.0.0.1:8000"}})
	require.NoError(t, err)
	assert.Equal(t, 4096, capacityOf(t, idx, "configured"))
	problems, err := testutil.CollectAndLint(capacityCollector{f})
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// capacities records the capacity_blocks each worker had in the last SetWorkers.
type capacities map[string]int

func (c capacities) SetWorkers(workers []router.Worker) {
	clear(c)
	for _, w := range workers {
		c[w.Name] = w.CapacityBlocks
	}
}

func TestKVEventSubscriptionsGetTheScrapedCapacity(t *testing.T) {
	idx, err := index.New(index.Config{CapacityBlocks: 100}, nil)
	require.NoError(t, err)
	events := capacities{}
	kv := &router.KVEvents{Endpoint: "tcp://{ip}:5557"}
	configured := router.Worker{Name: "configured", Address: "10.0.0.1:8000", Models: []string{"m"}, CapacityBlocks: 50, KVEvents: kv}
	scraped := router.Worker{Name: "scraped", Address: "10.0.0.2:8000", Models: []string{"m"}, KVEvents: kv}
	f, err := New([]router.Worker{configured, scraped}, Deps{Index: idx, Router: &recorder{}, Events: events, DefaultCapacityBlocks: 100})
	require.NoError(t, err)
	assert.Equal(t, capacities{"configured": 50, "scraped": 0}, events, "0: the default until the engine says")

	f.SetScrapedCapacity("scraped", "10.0.0.2:8000", 40_000)
	assert.Equal(t, capacities{"configured": 50, "scraped": 40_000}, events, "the engine-hash bound follows the engine's capacity")

	_, err = f.Apply([]router.Worker{configured, scraped})
	require.NoError(t, err)
	assert.Equal(t, 40_000, events["scraped"], "a later apply keeps it")
}

// TestCapacityMetricListsEveryWorkerOnce pins the metric's output for a fleet mixing
// the three sources, one series per worker, with the index default
// shown for workers that have no capacity of their own.
func TestCapacityMetricListsEveryWorkerOnce(t *testing.T) {
	idx, err := index.New(index.Config{CapacityBlocks: 100}, nil)
	require.NoError(t, err)
	workers := []router.Worker{
		{Name: "w0", Address: "10.0.0.1:8000", CapacityBlocks: 10},
		{Name: "w1", Address: "10.0.0.2:8000"},
		{Name: "w2", Address: "10.0.0.3:8000"},
		{Name: "w3", Address: "10.0.0.4:8000", CapacityBlocks: 30},
		{Name: "w4", Address: "10.0.0.5:8000"},
	}
	f, err := New(workers, Deps{Index: idx, Router: &recorder{}, DefaultCapacityBlocks: 100})
	require.NoError(t, err)
	f.SetScrapedCapacity("w1", "10.0.0.2:8000", 2000)
	f.SetScrapedCapacity("w3", "10.0.0.4:8000", 3000) // capacity_blocks wins
	f.SetScrapedCapacity("w4", "10.0.0.5:8000", 4000)
	reg := prometheus.NewRegistry()
	NewMetrics(reg, f)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_worker_capacity_blocks KV capacity in blocks the index bounds each worker's entries by, and its source: config (capacity_blocks), scraped (the engine's metrics page) or default (index.capacity_blocks).
# TYPE kvroute_worker_capacity_blocks gauge
kvroute_worker_capacity_blocks{source="config",worker="w0"} 10
kvroute_worker_capacity_blocks{source="scraped",worker="w1"} 2000
kvroute_worker_capacity_blocks{source="default",worker="w2"} 100
kvroute_worker_capacity_blocks{source="config",worker="w3"} 30
kvroute_worker_capacity_blocks{source="scraped",worker="w4"} 4000
`), "kvroute_worker_capacity_blocks"))

}

// BenchmarkCapacityCollect is one scrape of the capacity metric of a fleet of 1,000
// workers.
func BenchmarkCapacityCollect(b *testing.B) {
	idx, err := index.New(index.Config{CapacityBlocks: 100}, nil)
	require.NoError(b, err)
	workers := make([]router.Worker, 1000)
	for i := range workers {
		workers[i] = router.Worker{Name: fmt.Sprint("w", i), Address: fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)}
	}
	f, err := New(workers, Deps{Index: idx, Router: &recorder{}, DefaultCapacityBlocks: 100})
	require.NoError(b, err)
	ch := make(chan prometheus.Metric, len(workers))
	b.ReportAllocs()
	for b.Loop() {
		capacityCollector{f}.Collect(ch)
		for range len(workers) {
			<-ch
		}
	}
}
