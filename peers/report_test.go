package peers

import (
	"bufio"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

// fakeBookings is a replica's own ledger as the handler reads it.
type fakeBookings struct {
	mu      sync.Mutex
	loads   map[string]scoring.Load
	version uint64
}

func newFakeBookings(loads map[string]scoring.Load) *fakeBookings { return &fakeBookings{loads: loads} }

func (f *fakeBookings) Loads() map[string]scoring.Load {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.loads)
}

func (f *fakeBookings) Version() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.version
}

func (f *fakeBookings) set(loads map[string]scoring.Load) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads, f.version = loads, f.version+1
}

func testHandlerOptions(done <-chan struct{}) HandlerOptions {
	return HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, Done: done, MaxWatchers: 2}
}

// TestHandlerServesOwnBusyWorkersSorted: what a replica serves parses back to its own
// counts, busy workers only, in name order.
func TestHandlerServesOwnBusyWorkersSorted(t *testing.T) {
	h := Handler("r1", newFakeBookings(map[string]scoring.Load{
		"w2":   {PrefillTokens: 300, ActiveBlocks: 9, ActiveRequests: 2, PendingRequests: 1},
		"w1":   {ActiveBlocks: 4, ActiveRequests: 1},
		"idle": {},
	}), testHandlerOptions(nil))
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

// TestWatchStreamsEachChangeAndHeartbeats: a watcher gets the report at once, a new one
// after each change of the ledger, the same one again at the heartbeat when nothing
// changes, and the end of the stream when the server shuts down. Watchers beyond the
// bound are refused.
func TestWatchStreamsEachChangeAndHeartbeats(t *testing.T) {
	ledger := newFakeBookings(map[string]scoring.Load{"w": {ActiveRequests: 1}})
	done := make(chan struct{})
	srv := httptest.NewServer(Handler("r1", ledger, testHandlerOptions(done)))
	defer srv.Close()
	resp, err := http.Get(srv.URL + Path + "?watch")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
	lines := bufio.NewScanner(resp.Body)
	next := func() []WorkerLoad {
		t.Helper()
		require.True(t, lines.Scan(), "a report line")
		r, err := parseReport(lines.Bytes())
		require.NoError(t, err)
		return r.Workers
	}
	assert.Equal(t, []WorkerLoad{{Worker: "w", ActiveRequests: 1}}, next(), "the report at once")
	ledger.set(map[string]scoring.Load{"w": {ActiveRequests: 2, PendingRequests: 1, PrefillTokens: 64}})
	assert.Equal(t, []WorkerLoad{{Worker: "w", ActiveRequests: 2, PendingRequests: 1, PrefillTokens: 64}}, next(), "the change")
	assert.Equal(t, []WorkerLoad{{Worker: "w", ActiveRequests: 2, PendingRequests: 1, PrefillTokens: 64}}, next(), "the heartbeat")

	second, err := http.Get(srv.URL + Path + "?watch")
	require.NoError(t, err)
	defer second.Body.Close()
	require.Equal(t, http.StatusOK, second.StatusCode)
	third, err := http.Get(srv.URL + Path + "?watch")
	require.NoError(t, err)
	third.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, third.StatusCode, "MaxWatchers streams at once")

	close(done)
	for lines.Scan() {
	}
	assert.NoError(t, lines.Err(), "the stream ends cleanly at shutdown")
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

// BenchmarkReportOf64BusyWorkers is one report's CPU on both sides, without the
// network: written for 64 busy workers, as a watch stream sends it, then parsed.
func BenchmarkReportOf64BusyWorkers(b *testing.B) {
	loads := map[string]scoring.Load{}
	for i := range 64 {
		loads[fmt.Sprintf("vllm-qwen3-8b-7c9f8d6b5-%05d", i)] = scoring.Load{PrefillTokens: 12000, ActiveBlocks: 900, ActiveRequests: 40, PendingRequests: 6}
	}
	replica := NewReplicaID()
	b.ReportAllocs()
	for b.Loop() {
		line := reportOf(replica, loads)
		b.SetBytes(int64(len(line)))
		if _, err := parseReport(line); err != nil {
			b.Fatal(err)
		}
	}
}
