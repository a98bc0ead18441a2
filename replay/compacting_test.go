package replay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCompactingSessionsRestartFromASummary(t *testing.T) {
	cfg := DefaultCompacting()
	w := NewSessions(cfg, 3)
	r := w.Start()[0].Req
	var history []uint32 // the previous turn's prompt and output
	for k := 1; ; k++ {
		require.Equal(t, k, r.Turn)
		switch {
		case k > 1 && (k-1)%cfg.CompactEvery == 0:
			assert.Len(t, r.Prompt, cfg.SummaryTokens+cfg.UserTokens, "turn %d starts from the summary", k)
			assert.NotEqual(t, history[:64], r.Prompt[:64], "turn %d shares no leading block with the history it replaced", k)
		case k > 1:
			assert.Equal(t, history, r.Prompt[:len(history)], "turn %d extends the previous one", k)
		}
		history = append(append([]uint32(nil), r.Prompt...), r.Output...)
		next := w.Completed(r, time.Second)
		if k == cfg.Turns {
			assert.Empty(t, next)
			return
		}
		r = next[0].Req
	}
}

// TestSessionHeaderKeepsCompactedSessionsOnTheirWorker: prefix affinity alone moves
// compacted sessions (their new prompt is held nowhere); with the session header and a
// weight they stay, and the weight without the header changes nothing.
func TestSessionHeaderKeepsCompactedSessionsOnTheirWorker(t *testing.T) {
	const sticky = "kvroute:session_affinity_weight=16"
	tests := []struct {
		name      string
		policy    string
		header    bool
		wantMoved bool
	}{
		{"prefix affinity alone", "kvroute", true, true},
		{"the weight without the header", sticky, false, true},
		{"the weight with the header", sticky, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := workloadA(tt.policy, 1)
			cfg.SessionHeader = tt.header
			res, err := Run(cfg, NewSessions(DefaultCompacting(), 1))
			require.NoError(t, err)
			assert.Equal(t, tt.wantMoved, res.MovedTurns > 0, "%d moved turns", res.MovedTurns)
		})
	}
}
