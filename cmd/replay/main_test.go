package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSplitPolicies(t *testing.T) {
	assert.Equal(t, []string{"kv", "kv:prefix_affinity_weight=4,cache_pressure_weight=2", "round_robin"},
		splitPolicies("kv, kv:prefix_affinity_weight=4,cache_pressure_weight=2,round_robin"))
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

	for _, bad := range [][]string{
		{"-policies", "fastest"}, {"-workload", "mooncake"}, {"-seeds", "x"}, {"-format", "xml"},
		{"-workload", "mooncake", "-trace", "/nonexistent"},
	} {
		errOut.Reset()
		assert.Equal(t, 1, run(bad, &out, &errOut), strings.Join(bad, " "))
		assert.NotEmpty(t, errOut.String())
	}
}
