package peers

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

type loadsFunc func() map[string]scoring.Load

func (f loadsFunc) Loads() map[string]scoring.Load { return f() }

// TestHandlerServesOwnBusyWorkersSorted: what a replica serves parses back to its own
// counts, busy workers only, in name order.
func TestHandlerServesOwnBusyWorkersSorted(t *testing.T) {
	h := Handler("r1", loadsFunc(func() map[string]scoring.Load {
		return map[string]scoring.Load{
			"w2":   {PrefillTokens: 300, ActiveBlocks: 9, ActiveRequests: 2, PendingRequests: 1},
			"w1":   {ActiveBlocks: 4, ActiveRequests: 1},
			"idle": {},
		}
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	r, err := ParseReport(rec.Body)
	require.NoError(t, err)
	assert.Equal(t, Report{Version: Version, Replica: "r1", Workers: []WorkerLoad{
		{Worker: "w1", ActiveRequests: 1},
		{Worker: "w2", PrefillTokens: 300, ActiveRequests: 2, PendingRequests: 1},
	}}, r, "active blocks are not reported; idle workers are left out")
}

func TestParseReportRefusesWhatNoReplicaWrites(t *testing.T) {
	worker := func(fields string) string {
		return `{"version":1,"replica":"r","workers":[{"worker":"w"` + fields + `}]}`
	}
	many := make([]string, MaxReportWorkers+1)
	for i := range many {
		many[i] = fmt.Sprintf(`{"worker":"w%d"}`, i)
	}
	tests := []struct {
		name, body, wantErr string
	}{
		{"not JSON", `{"version":`, "report:"},
		{"another version", `{"version":2,"replica":"r","workers":[]}`, "version 2"},
		{"no replica id", `{"version":1,"workers":[]}`, "replica id"},
		{"long replica id", `{"version":1,"replica":"` + strings.Repeat("r", 65) + `"}`, "replica id"},
		{"negative count", worker(`,"active_requests":-1`), "workers[0].active_requests"},
		{"count above the bound", worker(`,"prefill_tokens":2147483649`), "workers[0].prefill_tokens"},
		{"count beyond int64", worker(`,"prefill_tokens":1e30`), "report:"},
		{"fractional count", worker(`,"active_requests":1.5`), "report:"},
		{"count as a string", worker(`,"active_requests":"1"`), "report:"},
		{"pending above active", worker(`,"active_requests":1,"pending_requests":2`), "pending_requests 2 above"},
		{"empty worker name", `{"version":1,"replica":"r","workers":[{"worker":""}]}`, "workers[0]: name"},
		{"long worker name", `{"version":1,"replica":"r","workers":[{"worker":"` + strings.Repeat("w", MaxWorkerName+1) + `"}]}`, "workers[0]: name"},
		{"repeated worker", `{"version":1,"replica":"r","workers":[{"worker":"w"},{"worker":"w"}]}`, `workers[1]: "w" repeated`},
		{"too many workers", `{"version":1,"replica":"r","workers":[` + strings.Join(many, ",") + `]}`, "workers, at most"},
		{"trailing data", `{"version":1,"replica":"r"} {}`, "after the JSON object"},
		{"too large", `{"version":1,"replica":"r","pad":"` + strings.Repeat("x", MaxReportBytes) + `"}`, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseReport(strings.NewReader(tt.body))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestParseReportIgnoresUnknownFields(t *testing.T) {
	r, err := ParseReport(strings.NewReader(`{"version":1,"replica":"r","future":{"x":1},"workers":[{"worker":"w","active_requests":3,"active_blocks":7}]}`))
	require.NoError(t, err)
	assert.Equal(t, []WorkerLoad{{Worker: "w", ActiveRequests: 3}}, r.Workers)
}

func FuzzParseReport(f *testing.F) {
	f.Add([]byte(`{"version":1,"replica":"r","workers":[{"worker":"w","prefill_tokens":10,"active_requests":2,"pending_requests":1}]}`))
	f.Add([]byte(`{"version":1,"replica":"r","workers":[]}`))
	f.Add([]byte(`{"version":1,"replica":"r","workers":[{"worker":"w","active_requests":-1}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseReport(strings.NewReader(string(body)))
		if err != nil {
			return
		}
		// What is accepted is within every bound a sum relies on.
		require.LessOrEqual(t, len(r.Workers), MaxReportWorkers)
		for _, w := range r.Workers {
			for _, n := range []int64{w.PrefillTokens, w.ActiveRequests, w.PendingRequests} {
				require.True(t, n >= 0 && n <= scoring.MaxPeerCount, "count %d", n)
			}
			require.LessOrEqual(t, w.PendingRequests, w.ActiveRequests)
		}
	})
}

// BenchmarkPollOf64BusyWorkers is one poll's CPU on both sides, without the network:
// the report served for 64 busy workers, then parsed.
func BenchmarkPollOf64BusyWorkers(b *testing.B) {
	loads := map[string]scoring.Load{}
	for i := range 64 {
		loads[fmt.Sprintf("vllm-qwen3-8b-7c9f8d6b5-%05d", i)] = scoring.Load{PrefillTokens: 12000, ActiveBlocks: 900, ActiveRequests: 40, PendingRequests: 6}
	}
	h := Handler(NewReplicaID(), loadsFunc(func() map[string]scoring.Load { return loads }))
	req := httptest.NewRequest(http.MethodGet, Path, nil)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		b.SetBytes(int64(rec.Body.Len()))
		if _, err := ParseReport(rec.Body); err != nil {
			b.Fatal(err)
		}
	}
}
