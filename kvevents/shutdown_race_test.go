package kvevents

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
)

// TestAReloadDuringShutdown: SetWorkers adding a worker while Run shuts down. Run
// stopped the new subscription before SetWorkers had started it (a data race on its
// cancel function), and SetWorkers then started its subscribers after Run returned.
func TestAReloadDuringShutdown(t *testing.T) {
	addr, _ := mute(t)
	for i := range 100 {
		idx, err := index.NewEventIndex(index.Config{CapacityBlocks: 100, TTL: time.Minute, PendingTTL: time.Second}, time.Now)
		require.NoError(t, err)
		m, err := New(DefaultConfig(), Deps{Index: idx, BlockSize: testBS})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { m.Run(ctx); close(done) }()
		require.Eventually(t, func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.ctx != nil }, waitFor, time.Millisecond)
		name := fmt.Sprintf("w%d", i)
		require.NoError(t, idx.SetWorker(name, 0))
		var wg sync.WaitGroup
		wg.Go(func() {
			m.SetWorkers([]router.Worker{{Name: name, Address: "127.0.0.1:1", Models: []string{testModel},
				KVEvents: &router.KVEvents{Endpoint: addr}}})
		})
		wg.Go(cancel)
		wg.Wait()
		<-done
	}
}
