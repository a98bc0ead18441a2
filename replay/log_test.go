package replay

import (
	"bufio"
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requestLog is a parsed request log.
type requestLog struct {
	requests []RequestLine
	passes   []PassLine
	evicts   []EvictLine
}

func runLogged(t *testing.T, cfg Config, w Workload) (Result, requestLog) {
	t.Helper()
	var buf bytes.Buffer
	cfg.Log = &buf
	res, err := Run(cfg, w)
	require.NoError(t, err)
	var log requestLog
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var kind struct{ Kind string }
		require.NoError(t, json.Unmarshal(sc.Bytes(), &kind))
		switch kind.Kind {
		case "request":
			var l RequestLine
			require.NoError(t, json.Unmarshal(sc.Bytes(), &l))
			log.requests = append(log.requests, l)
		case "pass":
			var l PassLine
			require.NoError(t, json.Unmarshal(sc.Bytes(), &l))
			log.passes = append(log.passes, l)
		case "evict":
			var l EvictLine
			require.NoError(t, json.Unmarshal(sc.Bytes(), &l))
			log.evicts = append(log.evicts, l)
		default:
			t.Fatalf("unknown line kind %q", kind.Kind)
		}
	}
	require.NoError(t, sc.Err())
	return res, log
}

func TestRequestLogAddsUpToTheResult(t *testing.T) {
	for _, policy := range []string{"kv", "kvroute"} {
		t.Run(policy, func(t *testing.T) {
			res, log := runLogged(t, workloadA(policy, 3), NewSessions(DefaultSessions(), 3))
			require.Len(t, log.requests, res.Requests)
			recomputed, moved, prompt := 0, 0, 0
			var resumed []time.Duration
			for _, r := range log.requests {
				recomputed += r.Recomputed
				prompt += r.Prompt
				assert.Equal(t, r.Prompt, r.Cached+r.Recomputed)
				assert.LessOrEqual(t, r.Floor, r.Recomputed, "request %d computes less than its floor", r.ID)
				assert.LessOrEqual(t, r.ArrivalMs, r.AdmittedMs)
				assert.Less(t, r.AdmittedMs, r.FirstTokenMs)
				assert.Len(t, r.Candidates, 2)
				if r.Turn > 1 {
					resumed = append(resumed, time.Duration(r.TTFTMs*float64(time.Millisecond)))
					if r.PrevWorker != r.Worker {
						moved++
					}
				}
			}
			assert.Equal(t, res.RecomputedPrefillTokens, recomputed)
			assert.Equal(t, res.PromptTokens, prompt)
			assert.Equal(t, res.MovedTurns, moved)
			assert.InDelta(t, res.ResumedTTFTP95ms, Percentile(resumed, 95), 1e-6)

			// Every first admission's prompt tokens are computed in some pass.
			computed := 0
			for _, p := range log.passes {
				computed += p.PrefillTokens
				assert.Less(t, p.StartMs, p.EndMs)
			}
			assert.Equal(t, recomputed+res.PreemptionRecomputeTokens, computed)
		})
	}
}

// The diagnosis of docs/BENCHMARKS.md ("Workload A: what placement can reach"),
// pinned on the shipped default's worst seed of 1–3: every token recomputed above the
// floor is a block of a session between turns (or in one) that the engine's LRU evicted
// late in the run, while the router still believed it cached; no turn moved, none was
// preempted, and no new session was placed after the first eviction.
func TestWorkloadAExcessIsEngineEvictionOfLiveSessions(t *testing.T) {
	res, log := runLogged(t, workloadA("kvroute", 3), NewSessions(DefaultSessions(), 3))
	assert.Equal(t, 0, res.MovedTurns)
	assert.Equal(t, 0, res.PreemptionRecomputeTokens)

	excess, lastNewSession := 0, 0.0
	for _, r := range log.requests {
		excess += r.Recomputed - r.Floor
		if r.Turn == 1 {
			lastNewSession = max(lastNewSession, r.ArrivalMs)
			continue
		}
		if r.Recomputed > r.Floor {
			assert.Greater(t, r.Predicted, r.Cached, "turn %d of session %d: its lost blocks were still in the index", r.Turn, r.Session)
		}
	}
	liveEvicted := 0
	for _, e := range log.evicts {
		require.GreaterOrEqual(t, e.Session, 0)
		assert.Greater(t, e.AtMs, lastNewSession, "no eviction while new sessions are placed")
		if e.State != "finished" {
			liveEvicted += e.Blocks
		}
	}
	assert.Equal(t, 11_008, excess, "seed 3: 87,296 recomputed against the 76,288 floor")
	assert.Equal(t, excess, liveEvicted*64, "the excess is the live sessions' evicted blocks, recomputed")
}

func TestEvictLinesNameTheSessionAndTheEvictingPass(t *testing.T) {
	_, log := runLogged(t, workloadA("kvroute", 3), NewSessions(DefaultSessions(), 3))
	require.NotEmpty(t, log.evicts)
	bySession := map[int][]RequestLine{}
	byID := map[int]RequestLine{}
	for _, r := range log.requests {
		bySession[r.Session] = append(bySession[r.Session], r)
		byID[r.ID] = r
	}
	for _, e := range log.evicts {
		require.NotEmpty(t, e.By)
		for _, id := range e.By {
			assert.Equal(t, e.Worker, byID[id].Worker, "the evicting request ran on the evicting worker")
		}
		// The evicted blocks were the session's, on that worker, before the eviction.
		held := false
		for _, r := range bySession[e.Session] {
			if r.Worker == e.Worker && r.FirstTokenMs <= e.AtMs {
				held = true
			}
		}
		assert.True(t, held, "session %d never ran on worker %d before %v ms", e.Session, e.Worker, e.AtMs)
	}
}

// A compacting session's turn that starts from a fresh summary shares no block with
// its previous turn: no router can serve any of it from a cache, so its floor is its
// whole prompt, not what it would be had the turn extended the history.
func TestRequestLogFloorOfACompactedTurnIsItsWholePrompt(t *testing.T) {
	cfg := DefaultCompacting()
	_, log := runLogged(t, workloadA("kvroute", 1), NewSessions(cfg, 1))
	compacted := 0
	for _, r := range log.requests {
		if r.Turn > 1 && (r.Turn-1)%cfg.CompactEvery == 0 {
			compacted++
			assert.Equal(t, r.Prompt, r.Floor, "turn %d of session %d", r.Turn, r.Session)
		} else if r.Turn > 1 && r.Turn <= cfg.CompactEvery {
			assert.Equal(t, 152, r.Floor, "turn %d of session %d extends its previous turn, as in Workload A", r.Turn, r.Session)
		}
	}
	assert.Equal(t, 2*cfg.Sessions, compacted)
}
