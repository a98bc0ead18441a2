package router

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// gatedPicker blocks its first Pick until released, so a test can start a second
// decision while the first one is inside the decision lock.
type gatedPicker struct {
	scoring.Picker
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (g *gatedPicker) Pick(ctx context.Context, req *scoring.Request, c []scoring.Candidate) (scoring.Decision, error) {
	if g.calls.Add(1) == 1 {
		close(g.entered)
		<-g.release
	}
	return g.Picker.Pick(ctx, req, c)
}

// watchedIndex reports its second Overlaps call: the second decision's lookup.
type watchedIndex struct {
	*index.Index
	calls  atomic.Int32
	second chan struct{}
}

func (w *watchedIndex) Overlaps(hashes []uint64, workers []string, dst []int) {
	if w.calls.Add(1) == 2 {
		close(w.second)
	}
	w.Index.Overlaps(hashes, workers, dst)
}

// TestConcurrentDecisionsSeeEachOthersBlocks: a decision reads the index under the
// decision lock, so a request arriving while another one of the same new prefix is
// being decided sees that decision's recorded blocks instead of scoring the prefix as
// absent everywhere.
func TestConcurrentDecisionsSeeEachOthersBlocks(t *testing.T) {
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	for _, w := range twoWorkers() {
		require.NoError(t, idx.SetWorker(w.Name, 0))
	}
	watched := &watchedIndex{Index: idx, second: make(chan struct{})}
	// Without the queue term, which would rightly send a second request away from a
	// worker whose first one has not started: this test is about what the index shows.
	params := scoring.DefaultParams()
	params.QueueWeight = 0
	kv, err := scoring.NewKVCost(params, rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	gate := &gatedPicker{Picker: kv, entered: make(chan struct{}), release: make(chan struct{})}
	r, err := New(Config{BlockSize: 4, Workers: twoWorkers()}, Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: watched,
		Bookings: scoring.NewBookings(), Picker: gate, RecordBlocks: true,
	})
	require.NoError(t, err)
	prompt := tokens(0, 40) // 10 blocks

	var first, second *Decision
	var wg sync.WaitGroup
	wg.Go(func() {
		var err error
		first, err = r.Route(context.Background(), &Request{Model: "m", Tokens: prompt})
		assert.NoError(t, err)
	})
	<-gate.entered
	wg.Go(func() {
		var err error
		second, err = r.Route(context.Background(), &Request{Model: "m", Tokens: prompt})
		assert.NoError(t, err)
	})
	// Give the second decision the chance to read the index before the first one has
	// recorded its blocks; reading under the lock, it cannot, and waits instead. (A
	// saturated machine only shortens the window: it cannot make this test fail.)
	select {
	case <-watched.second:
	case <-time.After(200 * time.Millisecond):
	}
	close(gate.release)
	wg.Wait()
	require.NotNil(t, first)
	require.NotNil(t, second)
	defer first.Release()
	defer second.Release()
	for _, term := range second.Terms {
		if term.Worker == first.Worker {
			assert.Equal(t, 10, term.Overlap, "the second decision saw the first one's blocks")
		}
	}
	assert.Equal(t, first.Worker, second.Worker, "so the prefix stays on one worker")
}
