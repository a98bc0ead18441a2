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

// TestSessionHeaderKeepsARewrittenSessionOnItsWorker: a session whose prompt is
// rewritten (no worker holds any of it) returns to its last worker when the session
// weight outweighs the load gap, and not otherwise.
func TestSessionHeaderKeepsARewrittenSessionOnItsWorker(t *testing.T) {
	tests := []struct {
		name      string
		sigma     float64
		session   string
		out       outSet // workers out for health
		wantSame  bool
		wantTerms bool // the session's worker carries the credit
	}{
		{"with the header and a weight above the load gap the session stays", 2, "s1", nil, true, true},
		{"a weight below the load gap: a bias, not a pin", 1, "s1", nil, false, true},
		{"without the header it follows the load", 2, "", nil, false, false},
		{"with weight 0 the header changes nothing", 0, "s1", nil, false, true},
		{"its worker out for health: the session moves", 2, "s1", outSet{}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			params := scoring.DynamoParams()
			params.SessionAffinityWeight = tt.sigma
			f := newFixture(t, params, twoWorkers()...)
			store, err := session.New(session.Config{TTL: time.Hour, MaxEntries: 10}, nil)
			require.NoError(t, err)
			f.router.deps.Sessions = store
			ctx := context.Background()

			first, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(0, 40), Session: tt.session})
			require.NoError(t, err)
			defer first.Release()
			// The first turn is still decoding: its worker carries its 10 blocks. The
			// rewritten prompt (9 blocks, held nowhere) costs 28 there and 18 on the
			// idle worker: only a session credit σ·9 above the gap of 10 keeps it.
			first.FirstToken()
			if tt.out != nil {
				tt.out[first.Worker] = true
				f.router.deps.Health = tt.out
			}
			rewritten, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(5000, 36), Session: tt.session})
			require.NoError(t, err)
			defer rewritten.Release()
			assert.Equal(t, tt.wantSame, rewritten.Worker == first.Worker, "worker %s then %s", first.Worker, rewritten.Worker)
			credited := false
			for _, term := range rewritten.Terms {
				if term.SessionWorker {
					credited = true
					assert.Equal(t, first.Worker, term.Worker)
					assert.InDelta(t, -tt.sigma*9, term.Session, 1e-9)
				}
			}
			assert.Equal(t, tt.wantTerms, credited)
			if tt.session != "" {
				last, ok := store.Lookup(tt.session)
				require.True(t, ok)
				assert.Equal(t, rewritten.Worker, last, "the decision is remembered for the session")
			}
		})
	}
}
