package kvevents

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
)

func TestTheEngineHashBoundsKeepTheTiersApart(t *testing.T) {
	w := router.Worker{Name: "a", Address: "127.0.0.1:1", Models: []string{testModel}, CapacityBlocks: 100,
		KVEvents: &router.KVEvents{Endpoint: "tcp://127.0.0.1:5557"}}
	for _, tt := range []struct {
		name            string
		tiers           []string
		offloadCapacity int
		held, offloaded int
	}{
		{"the device's blocks twice; the host's (4× the capacity) twice", []string{"device"}, 0, 200, 800},
		{"a configured host bound", []string{"device"}, 1000, 200, 2000},
		{"host counted as held: its blocks in the held bound", []string{"device", "host"}, 0, 1000, 800},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Tiers = tt.tiers
			if len(tt.tiers) > 1 {
				cfg.OffloadTiers = nil
			}
			m, err := New(cfg, Deps{Index: &index.EventIndex{}, BlockSize: testBS, DefaultCapacity: 10, OffloadCapacity: tt.offloadCapacity})
			require.NoError(t, err)
			held, offloaded := m.maxEntries(w)
			assert.Equal(t, [2]int{tt.held, tt.offloaded}, [2]int{held, offloaded})
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
	assert.Equal(t, 20, bound(), "twice the default capacity while the engine's is unknown")

	scraped := w
	scraped.CapacityBlocks = 40_000 // the engine's num_gpu_blocks, read after subscribing
	m.SetWorkers([]router.Worker{scraped})
	assert.Same(t, first, subscription(), "a capacity change keeps the stream and its state")
	assert.Equal(t, 80_000, bound())

	moved := scraped
	moved.KVEvents = &router.KVEvents{Endpoint: "tcp://127.0.0.1:5558"}
	m.SetWorkers([]router.Worker{moved})
	assert.NotSame(t, first, subscription(), "another endpoint is another stream")
	assert.Equal(t, 80_000, bound())
}

func TestAWorkersOffloadBlockSizeReachesItsApplier(t *testing.T) {
	m, err := New(DefaultConfig(), Deps{Index: &index.EventIndex{}, BlockSize: testBS, DefaultCapacity: 10})
	require.NoError(t, err)
	w := router.Worker{Name: "a", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: "tcp://127.0.0.1:5557", OffloadBlockSize: 4 * testBS}}
	assert.Equal(t, 4*testBS, m.newSubscription(w).applier.spec.OffloadBlockSize)
}
