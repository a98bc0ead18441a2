package router

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
)

// TestAMovedWorkerKeepsNoSessionCredit: a worker whose address changes is another
// engine with an empty cache (SetWorkers clears its index entries). The session credit
// σ·R exists to keep a session on the worker holding its KV when prefix overlap cannot
// tell; the new engine holds none of it, so it must not be credited as the session's
// last worker. SetWorkers forgets the sessions a moved (or removed) worker served last.
func TestAMovedWorkerKeepsNoSessionCredit(t *testing.T) {
	params := scoring.DynamoParams()
	params.SessionAffinityWeight = 100
	f := newFixture(t, params, twoWorkers()...)
	store, err := session.New(session.Config{TTL: time.Hour, MaxEntries: 10}, nil)
	require.NoError(t, err)
	f.router.deps.Sessions = store
	ctx := context.Background()

	first, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(0, 40), Session: "s"})
	require.NoError(t, err)
	first.Release()

	// The session's worker moves: another engine under its name.
	workers := twoWorkers()
	for i := range workers {
		if workers[i].Name == first.Worker {
			workers[i].Address = "127.0.0.1:9009"
		}
	}
	require.NoError(t, f.router.SetWorkers(workers))
	require.Zero(t, f.index.WorkerEntries(first.Worker), "the move cleared the old engine's blocks")

	next, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(5000, 36), Session: "s"})
	require.NoError(t, err)
	defer next.Release()
	for _, term := range next.Terms {
		assert.False(t, term.SessionWorker, "%s is credited as the session's worker after moving to a new engine (credit %v)", term.Worker, term.Session)
	}
}

// TestAMovedWorkerKeepsNoLoRAResidency: the ledger kept, under the moved worker's
// name, the adapters its old engine ran within lora_residency, so the new engine (which
// has loaded none) was priced as running them: B(w) = 0 for the old engine's adapter.
// SetWorkers now starts a moved worker anew in the ledger (Bookings.DetachWorker).
func TestAMovedWorkerKeepsNoLoRAResidency(t *testing.T) {
	workers := []Worker{{Name: "a", Address: "127.0.0.1:8001", MaxLoRAs: 1}, {Name: "b", Address: "127.0.0.1:8002", MaxLoRAs: 1}}
	r, _ := adapterRouter(t, workers, []LoRAAdapter{{Name: "x", BaseModel: "m"}}, nil)
	r.deps.Bookings = scoring.NewBookingsResident(time.Minute, nil)
	ctx := context.Background()
	first, err := r.Route(ctx, &Request{Model: "x", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	first.Release() // x stays resident on first.Worker's engine for a minute

	moved := append([]Worker(nil), workers...)
	for i := range moved {
		if moved[i].Name == first.Worker {
			moved[i].Address = "127.0.0.1:9009"
		}
	}
	require.NoError(t, r.SetWorkers(moved))
	next, err := r.Route(ctx, &Request{Model: "x", Tokens: tokens(7000, 40)})
	require.NoError(t, err)
	defer next.Release()
	for _, term := range next.Terms {
		if term.Worker == first.Worker {
			assert.NotZero(t, term.LoRABlocked, "the new engine at %s is priced as running x, which only the old engine ran", "127.0.0.1:9009")
		}
	}
}

// TestAMovedWorkerKeepsNoActiveBlocksOfItsOldEngine: requests still running on the
// old engine stayed booked under the worker's name, so the new engine's active set held
// their blocks: a prompt sharing them was priced as needing no new blocks there (new(w)
// < F), the credit SetWorkers' index clear exists to prevent. They now drain on a load
// of their own.
func TestAMovedWorkerKeepsNoActiveBlocksOfItsOldEngine(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	ctx := context.Background()
	running, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	defer running.Release() // still decoding on the old engine

	workers := twoWorkers()
	for i := range workers {
		if workers[i].Name == running.Worker {
			workers[i].Address = "127.0.0.1:9009"
		}
	}
	require.NoError(t, f.router.SetWorkers(workers))
	next, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(0, 44)})
	require.NoError(t, err)
	defer next.Release()
	for _, term := range next.Terms {
		if term.Worker == running.Worker {
			assert.Equal(t, next.Blocks, term.NewBlocks, "the new engine runs nothing, yet %d of the prompt's blocks count as in its active set", next.Blocks-term.NewBlocks)
		}
	}
}

// TestAPeersRecordForAMovedWorkersOldAddressIsNotStored: another replica's record of a
// decision it made when the worker was at its old address (peers.share_blocks) may
// arrive after this replica cleared the moved worker; storing it would credit the new
// engine with the old one's blocks. StoreRecord refuses it as moved, stores a record
// made at the current address, and one from a replica that names no address.
func TestAPeersRecordForAMovedWorkersOldAddressIsNotStored(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	workers := twoWorkers()
	workers[0].Address = "127.0.0.1:9009"
	require.NoError(t, f.router.SetWorkers(workers))
	tests := []struct {
		name      string
		address   string
		blocks    []uint64
		wantMoved bool
		wantHeld  int // the worker's entries after it
	}{
		{"made at its old address", "127.0.0.1:8001", []uint64{1, 2}, true, 0},
		{"made at its new address", "127.0.0.1:9009", []uint64{3, 4}, false, 2},
		{"from a replica that names no address", "", []uint64{5}, false, 3},
	}
	for _, tt := range tests {
		moved, err := f.router.StoreRecord("a", tt.address, tt.blocks)
		require.NoError(t, err, tt.name)
		assert.Equal(t, tt.wantMoved, moved, tt.name)
		assert.Equal(t, tt.wantHeld, f.index.WorkerEntries("a"), tt.name)
	}
	_, err := f.router.StoreRecord("gone", "", []uint64{1})
	assert.Error(t, err, "a worker this replica does not know")
}
