package kvevents

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
)

// TestSetWorkersThatPanicsHalfWayChangesNoSubscription: SetWorkers runs inside a
// fleet's Apply, whose panic a discovery source's guard recovers. One that panics
// while making the subscription of its second changed worker (a bug the discovered
// kv_events reach) leaves every subscription as it was, running: the first worker's
// old one is neither dropped unstopped (leaked, still applying its stream) nor replaced
// by one never started; and the next SetWorkers of that set, the discovery's retry,
// replaces and starts them both. Replaced half way, the first worker's new
// subscription was taken for the one in force by the retry and never started: its
// events were never followed.
func TestSetWorkersThatPanicsHalfWayChangesNoSubscription(t *testing.T) {
	ev, err := index.NewEventIndex(index.Config{CapacityBlocks: 100, TTL: time.Minute, PendingTTL: time.Second}, nil)
	require.NoError(t, err)
	var armed atomic.Bool
	m, err := New(DefaultConfig(), Deps{Index: ev, BlockSize: testBS, DefaultCapacity: 100,
		ApproxTokenizer: func(model string) bool {
			if model == "boom" && armed.CompareAndSwap(true, false) {
				panic("injected fault")
			}
			return false
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	m.mu.Lock()
	m.ctx = ctx // as Run sets it: SetWorkers starts what it subscribes
	m.mu.Unlock()
	t.Cleanup(func() {
		cancel()
		m.SetWorkers(nil)
	})
	worker := func(name, model, endpoint string) router.Worker {
		require.NoError(t, ev.SetWorker(name, 0))
		return router.Worker{Name: name, Address: "127.0.0.1:1", Models: []string{model},
			KVEvents: &router.KVEvents{Endpoint: endpoint}}
	}
	subscriptions := func() map[string]*subscription {
		m.mu.Lock()
		defer m.mu.Unlock()
		out := map[string]*subscription{}
		for name, sub := range m.workers {
			out[name] = sub
		}
		return out
	}
	running := func(sub *subscription) bool {
		m.mu.Lock() // start sets cancel under it
		defer m.mu.Unlock()
		return sub.cancel != nil
	}

	a, b := worker("a", testModel, "tcp://127.0.0.1:1"), worker("b", "boom", "tcp://127.0.0.1:2")
	m.SetWorkers([]router.Worker{a, b})
	before := subscriptions()
	require.Len(t, before, 2)

	a.KVEvents = &router.KVEvents{Endpoint: "tcp://127.0.0.1:3"}
	b.KVEvents = &router.KVEvents{Endpoint: "tcp://127.0.0.1:4"}
	armed.Store(true)
	require.PanicsWithValue(t, "injected fault", func() { m.SetWorkers([]router.Worker{a, b}) })
	after := subscriptions()
	assert.Same(t, before["a"], after["a"], "a's subscription in force stays, running")
	assert.Same(t, before["b"], after["b"])

	m.SetWorkers([]router.Worker{a, b}) // the retry
	for name, sub := range subscriptions() {
		assert.NotSame(t, before[name], sub, "%s's subscription is remade", name)
		assert.True(t, running(sub), "%s's new subscription runs", name)
	}
}
