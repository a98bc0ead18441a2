package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/replay"
)

func TestSplitPolicies(t *testing.T) {
	assert.Equal(t, []string{"kv", "kv:prefix_affinity_weight=4,cache_pressure_weight=2", "round_robin"},
		splitPolicies("kv, kv:prefix_affinity_weight=4,cache_pressure_weight=2,round_robin"))
}

func TestParseSeeds(t *testing.T) {
	tests := []struct {
		in      string
		want    []uint64
		wantErr string
	}{
		{"1", []uint64{1}, ""},
		{"1,2, 3", []uint64{1, 2, 3}, ""},
		{"1-4,9", []uint64{1, 2, 3, 4, 9}, ""},
		{"7-7", []uint64{7}, ""},
		{"x", nil, `"x" is not a seed`},
		{"4-2", nil, "first ≤ last"},
		{"1-", nil, "not a range"},
		{"-3", nil, "not a seed"},
		{"1-1000000", nil, "more than 10000 seeds"},
		{"0-18446744073709551615", nil, "more than 10000 seeds"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseSeeds(tt.in)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestReplayCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"-workload", "sessions", "-sessions", "4", "-turns", "3", "-seeds", "1,2", "-policies", "kv,kvroute", "-format", "json"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var results []map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &results))
	require.Len(t, results, 4)
	for _, key := range []string{"policy", "seed", "requests", "resumed_turns", "moved_turns", "recomputed_prefill_tokens", "prompt_tokens",
		"cache_hit_ratio", "non_max_overlap_selections", "ttft_p50_ms", "ttft_p95_ms", "resumed_ttft_p95_ms", "e2e_p95_ms", "makespan_s", "max_mean_prefill_load_ratio"} {
		assert.Contains(t, results[0], key)
	}
	assert.Equal(t, 12.0, results[0]["requests"])

	out.Reset()
	require.Equal(t, 0, run([]string{"-sessions", "2", "-turns", "2", "-policies", "round_robin"}, &out, &errOut))
	assert.Contains(t, out.String(), "round_robin")

	out.Reset()
	require.Equal(t, 0, run([]string{"-sessions", "2", "-turns", "2", "-seeds", "1-2", "-policies", "kv,kvroute"}, &out, &errOut))
	assert.Regexp(t, `kvroute\s+2\s+\d+–\d+\s+\d+\s+[\d.]+\s+[\d.]+ / [\d.]+`, out.String(), "a summary line over both seeds with ratios to kv")

	out.Reset()
	require.Equal(t, 0, run([]string{"-workload", "compacting", "-session-header", "-sessions", "2", "-turns", "6",
		"-policies", "kvroute:session_affinity_weight=16", "-format", "json"}, &out, &errOut), errOut.String())
	require.NoError(t, json.Unmarshal(out.Bytes(), &results))
	assert.Equal(t, 12.0, results[0]["requests"])
	assert.Equal(t, 0.0, results[0]["moved_turns"], "the session header keeps compacted sessions")

	out.Reset()
	require.Equal(t, 0, run([]string{"-workload", "shared-prefix", "-sessions", "4", "-turns", "2", "-replicas", "2", "-index", "events",
		"-shared-bookings", "-scrape-interval", "1s", "-policies", "gie,kvroute", "-format", "json"}, &out, &errOut), errOut.String())
	require.NoError(t, json.Unmarshal(out.Bytes(), &results))
	assert.Equal(t, 8.0, results[1]["requests"], "two replicas route every request")

	for _, bad := range [][]string{
		{"-workload", "compacting", "-summary-tokens", "-1"},
		{"-replicas", "-1"}, {"-scrape-interval", "-1s"}, {"-shared-bookings"}, {"-share-interval", "1s"},
		{"-policies", "fastest"}, {"-workload", "mooncake"}, {"-seeds", "x"}, {"-format", "xml"},
		{"-workload", "mooncake", "-trace", "/nonexistent"}, {"-workload", "shared-prefix", "-turns", "0"},
		{"-think-min", "2s", "-think-max", "1s"}, {"-workload", "fleet"},
		{"-dp-ranks", "0"}, {"-dp-routing", "header"}, {"-dp-ranks", "2", "-prefill-workers", "1"},
	} {
		errOut.Reset()
		assert.Equal(t, 1, run(bad, &out, &errOut), strings.Join(bad, " "))
		assert.NotEmpty(t, errOut.String())
	}
}

func TestSharedPrefixWorkloadTakesItsDefaultsUnderTheFlagsGiven(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"-workload", "shared-prefix", "-policies", "kvroute", "-format", "json"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var results []map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &results))
	require.Len(t, results, 1)
	assert.Equal(t, 192.0, results[0]["requests"], "32 sessions × 6 turns")
	assert.Equal(t, 160.0, results[0]["resumed_turns"])

	out.Reset()
	code = run([]string{"-workload", "shared-prefix", "-sessions", "3", "-turns", "2", "-router-max-num-seqs=false", "-policies", "kv,kvroute", "-format", "json"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.NoError(t, json.Unmarshal(out.Bytes(), &results))
	require.Len(t, results, 2)
	assert.Equal(t, 6.0, results[0]["requests"], "flags given override the workload's defaults")
	assert.Less(t, results[0]["prompt_tokens"].(float64), 6*3400.0, "the other defaults stay the shared-prefix workload's")
	assert.Greater(t, results[0]["prompt_tokens"].(float64), 6*3000.0)
}

func TestLogDirGetsOneRequestLogPerRun(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	code := run([]string{"-sessions", "4", "-turns", "3", "-seeds", "1,2", "-policies", "kvroute:queue_weight=0,partition:0101",
		"-log-dir", dir, "-format", "json"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	for _, name := range []string{"kvroute_queue_weight_0.seed1.jsonl", "kvroute_queue_weight_0.seed2.jsonl", "partition_0101.seed1.jsonl", "partition_0101.seed2.jsonl"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		kinds := map[string]int{}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			var l struct{ Kind string }
			require.NoError(t, json.Unmarshal([]byte(line), &l), name)
			kinds[l.Kind]++
		}
		assert.Equal(t, 12, kinds["request"], "%s: 4 sessions × 3 turns", name)
		assert.Positive(t, kinds["pass"], name)
	}

	errOut.Reset()
	assert.Equal(t, 1, run([]string{"-sessions", "2", "-turns", "2", "-log-dir", filepath.Join(dir, "missing")}, &out, &errOut))
	assert.Contains(t, errOut.String(), "missing")
}

// -prefill-workers runs a disaggregated fleet: the table gains its split columns, and
// the JSON its split fields; runs without prefill workers keep neither.
func TestReplayWithPrefillWorkers(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"-workload", "sessions", "-sessions", "4", "-turns", "2", "-prefill-workers", "2", "-policies", "kvroute,gie:disaggregate_tokens=100000"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	assert.Contains(t, out.String(), "transferred")
	lines := strings.Split(out.String(), "\n")
	require.Greater(t, len(lines), 2)
	assert.Regexp(t, `kvroute .* 8 +\d+\s*$`, lines[1], "kvroute splits all 8 requests")

	out.Reset()
	code = run([]string{"-workload", "sessions", "-sessions", "4", "-turns", "2", "-policies", "kvroute"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	assert.NotContains(t, out.String(), "transferred")
}

// -host-blocks gives the engines a host tier: the table gains its column, and with the
// events index the offload credit keeps sessions on the workers whose host memory
// holds their history (Workload A on a device too small for it: docs/BENCHMARKS.md,
// "Offloaded blocks").
func TestReplayWithAHostTier(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"-workload", "sessions", "-index", "events", "-num-gpu-blocks", "384", "-host-blocks", "2048", "-seeds", "1"}
	code := run(append(args, "-format", "json", "-policies", "kvroute:offload_credit=0,kvroute,kvroute:memory_weight=256"), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	var results []replay.Result
	require.NoError(t, json.Unmarshal(out.Bytes(), &results))
	require.Len(t, results, 3)
	unpriced, priced, memory := results[0], results[1], results[2]
	assert.Positive(t, unpriced.HostLoadedTokens, "the engines load what their host tier holds whatever the router does")
	assert.Positive(t, priced.HostLoadedTokens)
	assert.Positive(t, unpriced.MovedTurns, "priced as missing, the history does not hold sessions")
	assert.Zero(t, priced.MovedTurns)
	assert.Less(t, priced.RecomputedPrefillTokens, unpriced.RecomputedPrefillTokens)
	// The devices cannot hold the sessions running on them: memory_weight moves turns
	// off full holders, which shortens the resumed tail the credit alone lengthens.
	assert.Positive(t, memory.MovedTurns)
	assert.Less(t, memory.ResumedTTFTP95ms, priced.ResumedTTFTP95ms)

	out.Reset()
	code = run(append(args, "-policies", "kvroute"), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	assert.Contains(t, out.String(), "host loaded")

	errOut.Reset()
	code = run(append(args, "-tiers", "device,host", "-policies", "kvroute"), &out, &errOut)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut.String(), "-offload-tiers")
	assert.Contains(t, errOut.String(), "also in kv_events.tiers")

	// LMCache's chunks (4 blocks each, sent with their tokens) price as the blocks do.
	out.Reset()
	code = run(append(args, "-host-chunk-blocks", "4", "-format", "json", "-policies", "kvroute:offload_credit=0,kvroute"), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	results = nil
	require.NoError(t, json.Unmarshal(out.Bytes(), &results))
	require.Len(t, results, 2)
	unpriced, priced = results[0], results[1]
	assert.Positive(t, priced.HostLoadedTokens)
	assert.Positive(t, unpriced.MovedTurns)
	assert.Zero(t, priced.MovedTurns, "the chunks' credit holds sessions on their hosts")
	assert.Less(t, priced.RecomputedPrefillTokens, unpriced.RecomputedPrefillTokens)

	// Without KV events, -approximate-offload guesses the host tiers from the decisions
	// the capacity evicts: the credit then holds sessions as the engines' events do.
	approximate := []string{"-workload", "sessions", "-num-gpu-blocks", "384", "-host-blocks", "2048", "-seeds", "1", "-format", "json"}
	out.Reset()
	code = run(append(approximate, "-policies", "kvroute"), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	results = nil
	require.NoError(t, json.Unmarshal(out.Bytes(), &results))
	unguessed := results[0]
	out.Reset()
	code = run(append(approximate, "-approximate-offload", "-policies", "kvroute"), &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	results = nil
	require.NoError(t, json.Unmarshal(out.Bytes(), &results))
	guessed := results[0]
	assert.Positive(t, unguessed.MovedTurns)
	assert.Zero(t, guessed.MovedTurns)
	assert.Less(t, guessed.RecomputedPrefillTokens, unguessed.RecomputedPrefillTokens)

	errOut.Reset()
	code = run(append(args, "-approximate-offload", "-policies", "kvroute"), &out, &errOut)
	assert.Equal(t, 1, code, "the events index has the engines' own host tiers")
	assert.Contains(t, errOut.String(), "approximate offload: needs the approximate index source")

	errOut.Reset()
	code = run([]string{"-workload", "sessions", "-seeds", "1", "-approximate-offload", "-policies", "kvroute"}, &out, &errOut)
	assert.Equal(t, 1, code, "no host tier to guess")
	assert.Contains(t, errOut.String(), "approximate offload: needs engines with a host tier")
}

func TestReplayWithDataParallelRanks(t *testing.T) {
	args := []string{"-workload", "shared-prefix", "-sessions", "4", "-turns", "3", "-workers", "2", "-seeds", "1,2", "-policies", "gie,kvroute", "-format", "json"}
	replay := func(extra ...string) []byte {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(append(append([]string(nil), args...), extra...), &out, &errOut), errOut.String())
		return out.Bytes()
	}
	today := replay()
	assert.Equal(t, string(today), string(replay("-dp-ranks", "1")), "one rank is today's run")
	assert.Equal(t, string(today), string(replay("-dp-ranks", "1", "-dp-routing", "rank")))
	for _, routing := range []string{"blind", "rank"} {
		var results []map[string]any
		require.NoError(t, json.Unmarshal(replay("-dp-ranks", "2", "-dp-routing", routing), &results))
		require.Len(t, results, 4)
		assert.Equal(t, 12.0, results[0]["requests"], routing)
	}
}
