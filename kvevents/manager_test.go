package kvevents

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
)

func TestTheEngineHashBoundMakesRoomForTheOffloadTiers(t *testing.T) {
	w := router.Worker{Name: "a", Address: "127.0.0.1:1", Models: []string{testModel}, CapacityBlocks: 100,
		KVEvents: &router.KVEvents{Endpoint: "tcp://127.0.0.1:5557"}}
	for _, tt := range []struct {
		name            string
		tiers           []string
		offloadTiers    []string
		offloadCapacity int
		want            int
	}{
		{"no offload tier: the device's blocks, twice", []string{"device"}, nil, 0, 200},
		{"host offloaded: plus 4× the capacity", []string{"device"}, []string{"host"}, 0, 600},
		{"host offloaded with a configured bound", []string{"device"}, []string{"host"}, 1000, 1200},
		{"host counted as held: its blocks too", []string{"device", "host"}, nil, 0, 600},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Tiers, cfg.OffloadTiers = tt.tiers, tt.offloadTiers
			m, err := New(cfg, Deps{Index: &index.EventIndex{}, BlockSize: testBS, DefaultCapacity: 10, OffloadCapacity: tt.offloadCapacity})
			require.NoError(t, err)
			assert.Equal(t, tt.want, m.maxEntries(w))
		})
	}
}

func TestSetWorkersResizesTheEngineHashBoundInPlace(t *testing.T) {
	idx, err := index.NewEventIndex(index.Config{CapacityBlocks: 10, TTL: time.Minute, PendingTTL: time.Second}, nil)
	require.NoError(t, err)
	m, err := New(DefaultConfig(), Deps{Index: idx, BlockSize: testBS, DefaultCapacity: 10})
	require.NoError(t, err)
	w := router.Worker{Name: "a", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: "tcp://127.0.0.1:5557"}}
	subscription := func() *subscription {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.workers["a"]
	}
	bound := func() int {
		s := subscription()
		s.applier.mu.Lock()
		defer s.applier.mu.Unlock()
		return s.applier.spec.MaxEntries
	}

	m.SetWorkers([]router.Worker{w})
	first := subscription()
	require.NotNil(t, first)
	// Twice the capacity for the device's blocks, plus the host's (offload_tiers: 4×).
	assert.Equal(t, 60, bound(), "six times the default capacity while the engine's is unknown")

	scraped := w
	scraped.CapacityBlocks = 40_000 // the engine's num_gpu_blocks, read after subscribing
	m.SetWorkers([]router.Worker{scraped})
	assert.Same(t, first, subscription(), "a capacity change keeps the stream and its state")
	assert.Equal(t, 240_000, bound())

	moved := scraped
	moved.KVEvents = &router.KVEvents{Endpoint: "tcp://127.0.0.1:5558"}
	m.SetWorkers([]router.Worker{moved})
	assert.NotSame(t, first, subscription(), "another endpoint is another stream")
	assert.Equal(t, 240_000, bound())
}
