package discovery

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/router"
)

// fakeFleet records the sets applied; refuse makes the next Apply fail.
type fakeFleet struct {
	applied [][]router.Worker
	refuse  error
}

func (f *fakeFleet) Apply(workers []router.Worker) (fleet.Diff, error) {
	if f.refuse != nil {
		return fleet.Diff{}, f.refuse
	}
	f.applied = append(f.applied, workers)
	return fleet.Diff{Workers: len(workers)}, nil
}

// scripted is a Source that reports what its test sends it.
type scripted struct{ steps chan func(Sink) }

func (s scripted) Run(ctx context.Context, sink Sink) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case step := <-s.steps:
			step(sink)
		}
	}
}

var (
	wa = router.Worker{Name: "a", Address: "10.0.0.1:8000"}
	wb = router.Worker{Name: "b", Address: "10.0.0.2:8000"}
)

func TestRunnerAppliesChangesOnlyAndTracksReadiness(t *testing.T) {
	f := &fakeFleet{}
	reg := prometheus.NewRegistry()
	changes := 0
	r, err := NewRunner("test", scripted{}, RunnerDeps{Fleet: f, Metrics: NewMetrics(reg), OnChange: func() { changes++ }})
	require.NoError(t, err)
	assert.False(t, r.Ready(), "not ready before the first set")
	assert.Equal(t, 0.0, value(t, reg, "kvroute_discovery_synced", nil))

	r.Update(nil)
	assert.True(t, r.Synced())
	assert.True(t, r.Ready(), "synced with no worker: ready, as upstream pickers are")
	r.Update([]router.Worker{wa})
	assert.True(t, r.Ready())
	r.Update([]router.Worker{wa}) // a resync: same set
	assert.Len(t, f.applied, 2, "an unchanged set is not applied again")
	assert.Equal(t, 2, changes)

	r.Reject(errors.New("bad input"))
	assert.True(t, r.Ready(), "a rejection keeps the workers in force")
	assert.Len(t, f.applied, 2)
	assert.Equal(t, 1.0, value(t, reg, "kvroute_discovery_stale", nil))

	r.Update([]router.Worker{wa}) // the input came back valid and unchanged
	assert.Equal(t, 0.0, value(t, reg, "kvroute_discovery_stale", nil))
	r.Update([]router.Worker{wa, wb})
	assert.Equal(t, [][]router.Worker{nil, {wa}, {wa, wb}}, f.applied)
	assert.Equal(t, 2.0, value(t, reg, "kvroute_discovery_workers", nil))
	assert.Equal(t, 1.0, value(t, reg, "kvroute_discovery_synced", nil))
	assert.Equal(t, 3.0, value(t, reg, "kvroute_discovery_updates_total", map[string]string{"result": "applied"}))
	assert.Equal(t, 1.0, value(t, reg, "kvroute_discovery_updates_total", map[string]string{"result": "rejected"}))

	r.Update(nil)
	assert.True(t, r.Ready(), "a pool scaled to zero stays ready")
}

func TestRunnerIsNotReadyWhileItsSourceHasNothingToRead(t *testing.T) {
	f := &fakeFleet{}
	reg := prometheus.NewRegistry()
	var told []bool // Ready() as OnChange saw it
	var r *Runner
	r, err := NewRunner("test", scripted{}, RunnerDeps{Fleet: f, Metrics: NewMetrics(reg), OnChange: func() { told = append(told, r.Ready()) }})
	require.NoError(t, err)
	missing := errors.New("InferencePool llm/qwen not found")

	r.Missing(missing)
	assert.True(t, r.Synced())
	assert.False(t, r.Ready(), "a missing pool: synced, not ready")
	assert.NotContains(t, told, true, "never ready on the way to a missing first sync")
	assert.Equal(t, 1.0, value(t, reg, "kvroute_discovery_synced", nil))

	steps := []struct {
		name  string
		step  func()
		ready bool
	}{
		{"the pool appeared", func() { r.Update([]router.Worker{wa}) }, true},
		{"the pool deleted", func() { r.Missing(missing) }, false},
		{"the pool back, scaled to zero", func() { r.Update(nil) }, true},
		{"deleted again", func() { r.Missing(missing) }, false},
		// A rejected input changes nothing, readiness included: the pool back with a set
		// the fleet refuses leaves kvroute as the missing pool did.
		{"back with a set the fleet refuses", func() {
			f.refuse = errors.New("workers[1].address: duplicate")
			defer func() { f.refuse = nil }()
			r.Update([]router.Worker{wa, wb})
		}, false},
		{"its set accepted", func() { r.Update([]router.Worker{wb}) }, true},
	}
	for _, s := range steps {
		s.step()
		assert.Equal(t, s.ready, r.Ready(), s.name)
		require.NotEmpty(t, told)
		assert.Equal(t, s.ready, told[len(told)-1], "%s: OnChange told of the readiness in force", s.name)
	}
	assert.Equal(t, [][]router.Worker{nil, {wa}, nil, {wb}}, f.applied, "a missing pool leaves no worker in force")
}

func TestRunnerRejectsASetTheFleetRefusesAndLogsARepeatOnce(t *testing.T) {
	var logs bytes.Buffer
	f := &fakeFleet{}
	r, err := NewRunner("test", scripted{}, RunnerDeps{Fleet: f, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	r.Update([]router.Worker{wa})
	f.refuse = errors.New("workers[1].address: duplicate")
	r.Update([]router.Worker{wa, wb})
	r.Update([]router.Worker{wa, wb})
	assert.True(t, r.Ready(), "the workers in force stay")
	assert.Equal(t, 1, strings.Count(logs.String(), "discovery input rejected"), logs.String())
	assert.Contains(t, logs.String(), "workers[1].address: duplicate")
}

func TestRunnerAppliesAPreloadedSourceAtOnce(t *testing.T) {
	f := &fakeFleet{}
	r, err := NewRunner(SourceStatic, NewStatic([]router.Worker{wa, wb}), RunnerDeps{Fleet: f})
	require.NoError(t, err)
	assert.True(t, r.Ready(), "a static fleet is ready before Run")
	assert.Equal(t, [][]router.Worker{{wa, wb}}, f.applied)

	_, err = NewRunner(SourceStatic, NewStatic([]router.Worker{wa}), RunnerDeps{Fleet: &fakeFleet{refuse: errors.New("no")}})
	assert.ErrorContains(t, err, "refused")
	_, err = NewRunner("x", nil, RunnerDeps{Fleet: f})
	assert.Error(t, err)
}

func TestRunnerRunsTheSourceUntilCancelled(t *testing.T) {
	f := &fakeFleet{}
	src := scripted{steps: make(chan func(Sink))}
	r, err := NewRunner("test", src, RunnerDeps{Fleet: f})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	src.steps <- func(s Sink) { s.Update([]router.Worker{wb}) }
	src.steps <- func(Sink) {} // the first step has finished once this one is taken
	assert.True(t, r.Ready())
	cancel()
	<-done
}

// value reads one series of reg: name with labels.
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

func TestRunnerAppliesAReloadAndKeepsReadinessInStep(t *testing.T) {
	f := &fakeFleet{}
	reg := prometheus.NewRegistry()
	r, err := NewRunner(SourceStatic, NewStatic([]router.Worker{wa}), RunnerDeps{Fleet: f, Metrics: NewMetrics(reg)})
	require.NoError(t, err)
	diff, err := r.Apply([]router.Worker{wa, wb})
	require.NoError(t, err)
	assert.Equal(t, 2, diff.Workers)
	assert.Equal(t, []router.Worker{wa, wb}, r.Workers())
	assert.Equal(t, 2.0, value(t, reg, "kvroute_discovery_workers", nil))
	f.refuse = errors.New("workers[0].address: bad")
	_, err = r.Apply([]router.Worker{wb})
	assert.ErrorContains(t, err, "workers[0].address: bad", "a refused reload is the reload's error")
	assert.Equal(t, []router.Worker{wa, wb}, r.Workers())
}
