package router

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
)

// TestAResponseOfAWorkerThatMovedOrLeftMeanwhileIsNotRemembered: a request in flight
// when its worker moves (another engine at a new address) or leaves the fleet ends
// after SetWorkers forgot that worker's responses. Its id, learned then, named an engine
// that is gone: remembered, the new engine under the name (or the next worker to take
// the name) became the only candidate of every request naming it, where it is a 404.
func TestAResponseOfAWorkerThatMovedOrLeftMeanwhileIsNotRemembered(t *testing.T) {
	for _, change := range []string{"moved", "left"} {
		t.Run(change, func(t *testing.T) {
			f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
			store, err := session.New(session.Config{TTL: time.Hour, MaxEntries: 10}, nil)
			require.NoError(t, err)
			f.router.deps.Responses = store
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: []uint32{}})
			require.NoError(t, err)
			defer d.Release()

			var ws []Worker
			for _, w := range f.router.Workers() {
				switch {
				case w.Name != d.Worker:
				case change == "moved":
					w.Address = "127.0.0.1:9999"
				default:
					continue
				}
				ws = append(ws, w)
			}
			require.NoError(t, f.router.SetWorkers(ws))

			d.RememberResponse("resp_1")
			_, ok := store.Lookup("resp_1")
			assert.False(t, ok, "the engine that stored it is gone")
		})
	}
}

// TestAStoredResponsesWorkerAtMaxActiveRequestsIsA429: the worker that stored the
// response is the only one that can answer; at max_active_requests_per_worker the
// request is refused (429) rather than sent where it is a 404, and not counted as
// routed to its worker (README "Stored responses"). So is a turn of an SGLang session
// whose engine is full (README "SGLang's sessions"), which elsewhere is aborted.
func TestAStoredResponsesWorkerAtMaxActiveRequestsIsA429(t *testing.T) {
	for _, sglang := range []bool{false, true} {
		t.Run(fmt.Sprintf("sglang_session=%v", sglang), func(t *testing.T) {
			f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
			f.router.maxActive = 1
			metrics := NewMetrics(prometheus.NewRegistry())
			f.router.deps.Metrics = metrics
			store, err := session.New(session.Config{TTL: time.Hour, MaxEntries: 10}, nil)
			require.NoError(t, err)
			f.router.deps.Responses = store
			first, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: []uint32{}})
			require.NoError(t, err)
			defer first.Release()
			next, counter := &Request{Model: "m", Tokens: []uint32{}, PreviousResponseID: "id_1"}, metrics.stored
			if sglang {
				first.RememberSGLangSession("id_1")
				next, counter = &Request{Model: "m", Tokens: []uint32{}, SGLangSession: "id_1"}, metrics.sessions
			} else {
				first.RememberResponse("id_1")
			}
			_, err = f.router.Route(context.Background(), next)
			assert.True(t, errors.Is(err, ErrOverloaded), "%v", err)
			assert.Zero(t, testutil.ToFloat64(counter.WithLabelValues(StoredResponseWorker)), "a refused request was not routed")
		})
	}
}
