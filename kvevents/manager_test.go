package kvevents

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/fakeclock"
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

// hookIndex runs hooks inside the index calls of a worker's silence, to play a batch
// that arrives in the middle of it.
type hookIndex struct {
	*index.EventIndex
	onCleared, onApproximate func()
}

func (h *hookIndex) AllBlocksCleared(worker string) error {
	err := h.EventIndex.AllBlocksCleared(worker)
	if f := h.onCleared; f != nil {
		h.onCleared = nil
		f()
	}
	return err
}

func (h *hookIndex) SetMode(worker string, mode index.Mode) error {
	if f := h.onApproximate; f != nil && mode == index.ModeApproximate {
		h.onApproximate = nil
		f()
	}
	return h.EventIndex.SetMode(worker, mode)
}

// TestABatchDuringASilenceIsAppliedAfterIt: a worker found silent is cleared and put
// back in approximate mode as one step; a batch its stream delivers meanwhile lands
// after both, so the worker ends in event mode holding that batch, as its index and its
// engine-hash maps agree. Applied between the two, the batch's blocks stayed in an
// approximate worker's index and its maps.
func TestABatchDuringASilenceIsAppliedAfterIt(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_800_000_000, 0))
	ev, err := index.NewEventIndex(index.Config{CapacityBlocks: 100, TTL: time.Minute, PendingTTL: time.Second}, clock.Now)
	require.NoError(t, err)
	require.NoError(t, ev.SetWorker("w", 0))
	idx := &hookIndex{EventIndex: ev}
	cfg := DefaultConfig()
	m, err := New(cfg, Deps{Index: idx, BlockSize: testBS, DefaultCapacity: 100, Now: clock.Now})
	require.NoError(t, err)
	m.SetWorkers([]router.Worker{{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: "tcp://127.0.0.1:5557"}}}) // not run: batches are applied by hand
	m.mu.Lock()
	applier := m.workers["w"].applier
	m.mu.Unlock()
	batch := func(hashes []uint64, first int) []byte {
		payload, err := Encode(&Batch{Events: []Event{stored(hashes, 0, toks(first, len(hashes)*testBS))}}, FormMap)
		require.NoError(t, err)
		return payload
	}
	require.NoError(t, applier.Apply(0, batch([]uint64{1}, 0)))
	require.Equal(t, index.ModeEvents, ev.Mode("w"))
	// A decision's blocks the engine never reports: silent after silence_timeout.
	require.NoError(t, ev.Store("w", index.BlockHashes(nil, toks(900, 2*testBS), testBS, index.Salt(testModel, "", ""))))
	clock.Advance(cfg.SilenceTimeout)

	applied := make(chan struct{})
	idx.onCleared = func() {
		go func() {
			assert.NoError(t, applier.Apply(0, batch([]uint64{2}, 50)))
			close(applied)
		}()
	}
	idx.onApproximate = func() {
		// Give the batch every chance to run here, between the clear and the mode.
		select {
		case <-applied:
		case <-time.After(200 * time.Millisecond):
		}
	}
	m.CheckSilence()
	<-applied
	assert.Equal(t, index.ModeEvents, ev.Mode("w"), "the batch came after the silence: events resumed")
	assert.Equal(t, 1, ev.ConfirmedEntries("w"), "the index holds the batch's block")
	assert.Equal(t, 1, applier.Entries(), "and so do the engine-hash maps")
}
