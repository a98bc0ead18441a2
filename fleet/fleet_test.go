package fleet

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/poll"
	"github.com/kvroute/kvroute/router"
)

// recorder logs every call the fleet makes, in order.
type recorder struct {
	calls  []string
	refuse error // what ValidateWorkers answers
}

func (r *recorder) ValidateWorkers(workers []router.Worker) error {
	if r.refuse != nil {
		return r.refuse
	}
	return router.Config{BlockSize: 1, Workers: workers}.Validate()
}

func (r *recorder) SetWorker(name string, capacity int) error {
	r.calls = append(r.calls, fmt.Sprintf("index.set %s %d", name, capacity))
	return nil
}
func (r *recorder) RemoveWorker(name string) { r.calls = append(r.calls, "index.remove "+name) }

type ledger struct{ r *recorder }

func (l ledger) RemoveWorker(name string) { l.r.calls = append(l.r.calls, "bookings.remove "+name) }

func (r *recorder) SetWorkers(workers []router.Worker) error {
	r.calls = append(r.calls, fmt.Sprintf("router %d", len(workers)))
	return nil
}

type watcher struct{ r *recorder }

func (w watcher) SetWorkers(targets []poll.Target) {
	w.r.calls = append(w.r.calls, fmt.Sprintf("watch %d", len(targets)))
}

type events struct{ r *recorder }

func (e events) SetWorkers(workers []router.Worker) {
	e.r.calls = append(e.r.calls, fmt.Sprintf("events %d", len(workers)))
}

func TestApply(t *testing.T) {
	a := router.Worker{Name: "a", Address: "127.0.0.1:1"}
	b := router.Worker{Name: "b", Address: "127.0.0.1:2"}
	tests := []struct {
		name  string
		next  []router.Worker
		diff  Diff
		calls []string
	}{
		{"unchanged: only the lists are refreshed", []router.Worker{a, b}, Diff{Workers: 2}, []string{"watch 2", "router 2", "events 2"}},
		{"added joins the index before the router and its events", []router.Worker{a, b, {Name: "c", Address: "127.0.0.1:3"}}, Diff{Workers: 3, Added: []string{"c"}},
			[]string{"index.set c 0", "watch 3", "router 3", "events 3"}},
		{"removed stops its events before it leaves the index and the ledger", []router.Worker{a}, Diff{Workers: 1, Removed: []string{"b"}},
			[]string{"watch 1", "router 1", "events 1", "index.remove b", "bookings.remove b"}},
		{"a new address reaches the router (which clears the cache entries)", []router.Worker{a, {Name: "b", Address: "127.0.0.1:9"}}, Diff{Workers: 2, Changed: []string{"b"}},
			[]string{"index.set b 0", "watch 2", "router 2", "events 2"}},
		{"a new capacity keeps them", []router.Worker{a, {Name: "b", Address: "127.0.0.1:2", CapacityBlocks: 7}}, Diff{Workers: 2, Changed: []string{"b"}},
			[]string{"index.set b 7", "watch 2", "router 2", "events 2"}},
		{"new batch slots reach the router and keep the cache", []router.Worker{a, {Name: "b", Address: "127.0.0.1:2", MaxNumSeqs: 16}}, Diff{Workers: 2, Changed: []string{"b"}},
			[]string{"index.set b 0", "watch 2", "router 2", "events 2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			f, err := New([]router.Worker{a, b}, Deps{Index: rec, Router: rec, Watchers: []Watcher{watcher{rec}}, Events: events{rec}, Bookings: ledger{rec}})
			require.NoError(t, err)
			rec.calls = nil
			diff, err := f.Apply(tt.next)
			require.NoError(t, err)
			assert.Equal(t, tt.diff, diff)
			assert.Equal(t, tt.calls, rec.calls)
			assert.Equal(t, tt.next, f.Workers())
		})
	}
}

func TestAnInvalidSetChangesNothing(t *testing.T) {
	rec := &recorder{}
	a := router.Worker{Name: "a", Address: "127.0.0.1:1"}
	f, err := New([]router.Worker{a}, Deps{Index: rec, Router: rec})
	require.NoError(t, err)
	rec.calls = nil
	_, err = f.Apply([]router.Worker{a, {Name: "a", Address: "127.0.0.1:2"}})
	require.ErrorContains(t, err, "duplicate worker name")
	assert.Empty(t, rec.calls)
	assert.Equal(t, []router.Worker{a}, f.Workers())
}

// A set the router refuses (a worker listing one of its LoRA adapters) changes nothing
// either: the router is asked before the index, watchers and subscriptions hear of it.
func TestASetTheRouterRefusesChangesNothing(t *testing.T) {
	rec := &recorder{}
	a := router.Worker{Name: "a", Address: "127.0.0.1:1"}
	f, err := New([]router.Worker{a}, Deps{Index: rec, Router: rec, Watchers: []Watcher{watcher{rec}}, Events: events{rec}})
	require.NoError(t, err)
	rec.calls, rec.refuse = nil, errors.New(`workers[0].models[0]: "sql" is a LoRA adapter`)
	_, err = f.Apply([]router.Worker{{Name: "b", Address: "127.0.0.1:2", Models: []string{"sql"}}})
	require.ErrorContains(t, err, "LoRA adapter")
	assert.Empty(t, rec.calls)
	assert.Equal(t, []router.Worker{a}, f.Workers())
}

func TestTargetsSayWhichWorkersSpeakH2C(t *testing.T) {
	tests := []struct {
		name     string
		protocol string
		wantH2C  bool
	}{
		{"no protocol: HTTP/1.1", "", false},
		{"http: HTTP/1.1", router.ProtocolHTTP, false},
		{"h2c", router.ProtocolH2C, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Targets([]router.Worker{{Name: "a", Address: "127.0.0.1:1", Protocol: tt.protocol, Role: router.RoleDecode}})
			assert.Equal(t, []poll.Target{{Name: "a", Address: "127.0.0.1:1", H2C: tt.wantH2C}}, got)
		})
	}
}

// panicEvents are subscriptions that panic when armed, after recording the call.
type panicEvents struct {
	r     *recorder
	armed bool
}

func (e *panicEvents) SetWorkers(workers []router.Worker) {
	e.r.calls = append(e.r.calls, fmt.Sprintf("events %d", len(workers)))
	if e.armed {
		e.armed = false
		panic("injected fault")
	}
}

// TestTheApplyAfterOneThatPanickedUndoesWhatItDid: an Apply that panics half way (a
// discovery source's guard recovers it) has added a worker to the index and the router
// already; the next Apply, of a set without it, takes it out of the index and the
// ledger too. Judged against the workers in force before the panic, it was never
// removed: the index kept a worker no router routes to (and the blocks decided for it
// while the router had it, which a later engine under its name was then credited with).
func TestTheApplyAfterOneThatPanickedUndoesWhatItDid(t *testing.T) {
	a := router.Worker{Name: "a", Address: "127.0.0.1:1"}
	b := router.Worker{Name: "b", Address: "127.0.0.1:2"}
	rec := &recorder{}
	events := &panicEvents{r: rec}
	f, err := New([]router.Worker{a}, Deps{Index: rec, Router: rec, Events: events, Bookings: ledger{rec}})
	require.NoError(t, err)

	events.armed = true
	rec.calls = nil
	require.PanicsWithValue(t, "injected fault", func() { _, _ = f.Apply([]router.Worker{a, b}) })
	require.Equal(t, []string{"index.set b 0", "router 2", "events 2"}, rec.calls, "b reached the index and the router")

	rec.calls = nil
	diff, err := f.Apply([]router.Worker{a})
	require.NoError(t, err)
	assert.Contains(t, rec.calls, "index.remove b")
	assert.Contains(t, rec.calls, "bookings.remove b")
	assert.Equal(t, []string{"b"}, diff.Removed)
	assert.Equal(t, []router.Worker{a}, f.Workers())
}

// panicIndex is an index whose SetWorker panics when armed.
type panicIndex struct {
	*recorder
	armed bool
}

func (x *panicIndex) SetWorker(name string, capacity int) error {
	if x.armed {
		x.armed = false
		panic("injected fault")
	}
	return x.recorder.SetWorker(name, capacity)
}

// TestAScrapedCapacityWhoseApplyPanickedIsAppliedWhenReportedAgain: the scraper
// reports a capacity again after its report panicked (the scrape's guard recovers it);
// the fleet then gives it to the index. Recorded before the index took it, it was
// taken for one in force, and the index kept the old capacity for good.
func TestAScrapedCapacityWhoseApplyPanickedIsAppliedWhenReportedAgain(t *testing.T) {
	a := router.Worker{Name: "a", Address: "127.0.0.1:1"}
	rec := &recorder{}
	idx := &panicIndex{recorder: rec}
	f, err := New([]router.Worker{a}, Deps{Index: idx, Router: rec})
	require.NoError(t, err)

	idx.armed = true
	require.PanicsWithValue(t, "injected fault", func() { f.SetScrapedCapacity("a", a.Address, 500) })
	rec.calls = nil
	f.SetScrapedCapacity("a", a.Address, 500)
	assert.Equal(t, []string{"index.set a 500"}, rec.calls)
	blocks, source, _ := f.Capacity("a")
	assert.Equal(t, 500, blocks)
	assert.Equal(t, CapacityScraped, source)
}
