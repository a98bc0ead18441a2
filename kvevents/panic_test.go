package kvevents

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/background/backgroundtest"
	"github.com/kvroute/kvroute/internal/fakeclock"
	"github.com/kvroute/kvroute/router"
)

// panicIndex panics at its panicAt-th BlockStored, after the ones before it went
// through: a bug an engine's batch reaches in the middle of being applied.
type panicIndex struct {
	*index.EventIndex
	stores, panicAt int
	// clearPanics: AllBlocksCleared panics too.
	clearPanics bool
}

func (p *panicIndex) AllBlocksCleared(worker string) error {
	if p.clearPanics {
		panic("injected fault in the clear")
	}
	return p.EventIndex.AllBlocksCleared(worker)
}

func (p *panicIndex) BlockStored(worker string, hashes []uint64) error {
	if p.stores++; p.stores == p.panicAt {
		panic("injected fault")
	}
	return p.EventIndex.BlockStored(worker, hashes)
}

// messages is what a socket receives, then the end of its connection.
type messages []Message

func (m *messages) Recv() (zmq4.Msg, error) {
	if len(*m) == 0 {
		return zmq4.Msg{}, io.EOF
	}
	next := (*m)[0]
	*m = (*m)[1:]
	return zmq4.NewMsgFrom(MessageFrames("kv", next.Seq, next.Payload)...), nil
}

// TestABatchThatPanicsIsLostAndTheWorkerCleared: a panic in the middle of applying a
// batch (its first block stored, its second not) is recovered and counted, and the
// batch is lost as an undecodable one is: the worker's entries, every rank's, are
// cleared, with the blocks the batch stored before the panic, and the stream goes on
// from the next batch, which follows the one that panicked (no replay is asked).
func TestABatchThatPanicsIsLostAndTheWorkerCleared(t *testing.T) {
	tests := []struct {
		name   string
		ranks  int
		replay bool
	}{
		{name: "one rank", ranks: 1},
		{name: "one rank with a replay endpoint", ranks: 1, replay: true},
		{name: "the panic on rank 1 clears rank 0's entries too", ranks: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := fakeclock.New(time.Unix(1_800_000_000, 0))
			ev, err := index.NewEventIndex(index.Config{CapacityBlocks: 100, TTL: time.Minute, PendingTTL: time.Second}, clock.Now)
			require.NoError(t, err)
			require.NoError(t, ev.SetWorker("w", 0))
			idx := &panicIndex{EventIndex: ev, panicAt: 3}
			reg := prometheus.NewRegistry()
			m, err := New(DefaultConfig(), Deps{Index: idx, BlockSize: testBS, DefaultCapacity: 100, Now: clock.Now,
				Registerer: reg, Panics: background.NewMetrics(reg)})
			require.NoError(t, err)
			m.SetWorkers([]router.Worker{{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
				KVEvents: &router.KVEvents{Endpoint: "tcp://127.0.0.1:5557", DataParallelSize: tt.ranks}}}) // not run: fed by hand
			m.mu.Lock()
			sub := m.workers["w"]
			m.mu.Unlock()
			engine := &engineLog{t: t}
			last := sub.subs[tt.ranks-1]
			if tt.replay {
				last.stream.replay = engine.replay
			}
			ctx := context.Background()

			sub.subs[0].receive(ctx, &messages{engine.batch(0, blockAt(0))})
			require.True(t, held(&harness{idx: ev, clock: clock}, 0))
			seq := uint64(0) // another rank's stream numbers from its own 0
			if tt.ranks == 1 {
				seq = 1 // after rank 0's batch 0
			}
			last.receive(ctx, &messages{
				engine.batch(seq, blockAt(1), blockAt(2)), // stores block 1, panics at block 2
				engine.batch(seq+1, blockAt(3)),
			})

			assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopKVEvents))
			assert.Equal(t, 1.0, testutil.ToFloat64(m.metrics.resets.WithLabelValues("w", reasonPanic)))
			h := &harness{idx: ev, clock: clock}
			for i, want := range []bool{false, false, false, true} {
				assert.Equal(t, want, held(h, i), "block %d", i)
			}
			assert.Equal(t, 1, sub.applier.Entries(), "the engine-hash maps agree with the index")
			assert.Equal(t, 1, ev.ConfirmedEntries("w"))
			assert.Equal(t, index.ModeEvents, ev.Mode("w"))
			assert.Empty(t, engine.replays, "the batch after the one that panicked follows it: no gap")
		})
	}
}

// TestABatchWhoseClearingPanicsTooIsLostAndTheStreamGoesOn: the batch panics, and so
// does the clearing of the worker's entries that follows (the index's bug, twice).
// Both panics are recovered and counted, and the batch after it is still applied.
func TestABatchWhoseClearingPanicsTooIsLostAndTheStreamGoesOn(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_800_000_000, 0))
	ev, err := index.NewEventIndex(index.Config{CapacityBlocks: 100, TTL: time.Minute, PendingTTL: time.Second}, clock.Now)
	require.NoError(t, err)
	require.NoError(t, ev.SetWorker("w", 0))
	idx := &panicIndex{EventIndex: ev, panicAt: 2, clearPanics: true}
	reg := prometheus.NewRegistry()
	m, err := New(DefaultConfig(), Deps{Index: idx, BlockSize: testBS, DefaultCapacity: 100, Now: clock.Now,
		Registerer: reg, Panics: background.NewMetrics(reg)})
	require.NoError(t, err)
	m.SetWorkers([]router.Worker{{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: "tcp://127.0.0.1:5557"}}}) // not run: fed by hand
	m.mu.Lock()
	sub := m.workers["w"]
	m.mu.Unlock()
	engine := &engineLog{t: t}
	sub.subs[0].receive(context.Background(), &messages{
		engine.batch(0, blockAt(0), blockAt(1)), // stores block 0, panics at block 1, then in the clear
		engine.batch(1, blockAt(2)),
	})
	assert.Equal(t, 2.0, backgroundtest.Panics(t, reg, background.LoopKVEvents), "the batch's panic and the clear's")
	assert.True(t, held(&harness{idx: ev, clock: clock}, 2), "the next batch is applied")
}
