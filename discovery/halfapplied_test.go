package discovery

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/router"
)

// fleetParts are a real fleet's router and index: the router keeps the set it was
// given, the index the names it knows.
type fleetParts struct {
	routed  []router.Worker
	indexed map[string]bool
}

func (p *fleetParts) ValidateWorkers([]router.Worker) error { return nil }
func (p *fleetParts) SetWorkers(workers []router.Worker) error {
	p.routed = slices.Clone(workers)
	return nil
}
func (p *fleetParts) SetWorker(name string, _ int) error { p.indexed[name] = true; return nil }
func (p *fleetParts) RemoveWorker(name string)           { delete(p.indexed, name) }

// panicEvents are KV events subscriptions that panic when armed: a bug a discovered
// worker's kv_events reach after the router took the set.
type panicEvents struct{ armed bool }

func (e *panicEvents) SetWorkers([]router.Worker) {
	if e.armed {
		e.armed = false
		panic("injected fault")
	}
}

// TestASetWhoseApplyPanickedHalfWayIsNotTakenForTheSetInForce: the fleet's Apply of
// a new set panics after the router took it (the source's guard recovers it, and the
// set is rejected). The set in force is then no longer the fleet's for sure: when the
// source offers it again (the file changed back, a pod that came and went), it is
// applied, and the router stops routing to the worker the source no longer lists.
// Taken for the set in force and skipped, it left the router routing to that worker
// until the next change of the set.
func TestASetWhoseApplyPanickedHalfWayIsNotTakenForTheSetInForce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workers.yaml")
	write(t, path, workersYAML("a"))
	f, err := NewFile(path, nil, nil)
	require.NoError(t, err)
	parts := &fleetParts{indexed: map[string]bool{}}
	events := &panicEvents{}
	fl, err := fleet.New(f.Workers(), fleet.Deps{Index: parts, Router: parts, Events: events})
	require.NoError(t, err)
	r, err := NewRunner("file", f, RunnerDeps{Fleet: fl})
	require.NoError(t, err)

	events.armed = true
	write(t, path, workersYAML("a", "b"))
	f.reload(r, false)
	require.Equal(t, []string{"a", "b"}, names(parts.routed), "the router took b before the panic")
	require.Equal(t, []string{"a"}, names(r.Workers()), "the set was rejected")

	write(t, path, workersYAML("a")) // b goes again
	f.reload(r, false)
	assert.Equal(t, []string{"a"}, names(parts.routed), "b, which the file no longer lists, is not routed to")
	assert.Equal(t, []string{"a"}, names(fl.Workers()))
	assert.Equal(t, map[string]bool{"a": true}, parts.indexed, "nor held in the index")
}
