package replay

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/sim"
)

func TestTheBlindBalancerPicksTheRankWithFewestWaitingPlusRunning(t *testing.T) {
	// Two servers of three ranks: engines 0–2 are w0's, 3–5 w1's.
	cfg := sim.Config{NumGPUBlocks: 64, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 8192}
	rn := &run{ranks: 3}
	for range 6 {
		e, err := sim.New(cfg)
		require.NoError(t, err)
		rn.engines = append(rn.engines, e)
	}
	id := 0
	add := func(ei, n int) {
		for range n {
			id++
			require.NoError(t, rn.engines[ei].Add(&sim.Request{ID: id, Prompt: []uint32{1, 2, 3}, Output: []uint32{4}}))
		}
	}
	assert.Equal(t, 0, rn.pickRank(0), "all idle: the lowest rank")
	assert.Equal(t, 3, rn.pickRank(1), "a server's own lowest rank")

	add(0, 1)
	assert.Equal(t, 1, rn.pickRank(0), "a waiting request counts")
	add(1, 1)
	assert.Equal(t, 2, rn.pickRank(0))
	add(2, 1)
	assert.Equal(t, 0, rn.pickRank(0), "a tie of every rank: the lowest")

	// Rank 0's request runs: waiting plus running still counts it.
	_, ok, err := rn.engines[0].StartPass(0)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 1, rn.engines[0].Running())
	require.Equal(t, 0, rn.engines[0].Waiting())
	assert.Equal(t, 0, rn.pickRank(0), "one running ties one waiting: the lowest rank")
	add(0, 1)
	add(2, 2)
	assert.Equal(t, 1, rn.pickRank(0), "ranks at 2, 1, 3: the fewest")
	assert.Equal(t, 3, rn.pickRank(1), "the other server's ranks are apart")
}

func TestOneDataParallelRankIsTodaysRun(t *testing.T) {
	run := func(cfg Config) string {
		res, err := Run(cfg, NewSessions(DefaultSessions(), 3))
		require.NoError(t, err)
		b, err := json.Marshal(res)
		require.NoError(t, err)
		return string(b)
	}
	for _, source := range []string{SourceApproximate, SourceEvents} {
		cfg := workloadA("kvroute", 3)
		cfg.IndexSource, cfg.ScrapeInterval, cfg.BypassShare = source, 100*time.Millisecond, 0.2
		today := run(cfg)
		for _, rank := range []bool{false, true} {
			one := cfg
			one.DPRanks, one.DPRankRouting = 1, rank
			assert.Equal(t, today, run(one), "%s, rank routing %v", source, rank)
		}
	}
}

func TestRankRoutingIsAWorkerPerRank(t *testing.T) {
	cfg := workloadA("kvroute", 4)
	cfg.DPRanks, cfg.DPRankRouting = 2, true
	ranks, err := Run(cfg, NewSessions(DefaultSessions(), 4))
	require.NoError(t, err)
	cfg.Workers, cfg.DPRanks, cfg.DPRankRouting = 4, 0, false
	workers, err := Run(cfg, NewSessions(DefaultSessions(), 4))
	require.NoError(t, err)
	assert.Equal(t, workers, ranks)
}

func TestBlindServersOfRanksServeEveryRequestAndLoseAffinity(t *testing.T) {
	// Two servers of four ranks, each rank Workload A's engine: routed to its server,
	// a turn lands on whichever rank is least loaded, not on the one holding its
	// session, so it misses more than when the router picks the rank. With KV events
	// every rank's stream feeds its server's worker.
	for _, source := range []string{SourceApproximate, SourceEvents} {
		cfg := workloadA("kvroute", 1)
		cfg.IndexSource, cfg.DPRanks = source, 4
		blind, err := Run(cfg, NewSessions(DefaultSessions(), 1))
		require.NoError(t, err, source)
		cfg.DPRankRouting = true
		rank, err := Run(cfg, NewSessions(DefaultSessions(), 1))
		require.NoError(t, err, source)
		assert.Equal(t, 192, blind.Requests, source)
		assert.Less(t, blind.CacheHitRatio, rank.CacheHitRatio, source)
		assert.Greater(t, blind.MovedTurns, rank.MovedTurns, "%s: moved turns count ranks", source)
	}
}

func TestDataParallelRankConfigErrors(t *testing.T) {
	for name, mod := range map[string]func(*Config){
		"negative":        func(c *Config) { c.DPRanks = -1 },
		"prefill workers": func(c *Config) { c.DPRanks, c.PrefillWorkers = 2, 1 },
		"lora":            func(c *Config) { c.DPRanks, c.LoRAAdapters = 2, []string{"a"} },
	} {
		cfg := workloadA("kv", 1)
		mod(&cfg)
		_, err := Run(cfg, NewSessions(DefaultSessions(), 1))
		assert.ErrorContains(t, err, "dp ranks", name)
	}
}
