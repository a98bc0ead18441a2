package peers

import (
	"encoding/base64"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

// blockStore is an index that records what it is told, and knows some workers.
type blockStore struct {
	mu      sync.Mutex
	known   map[string]bool
	records []string // "worker:hashes"
}

func (s *blockStore) Store(worker string, blocks []uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.known[worker] {
		return fmt.Errorf("unknown worker %q", worker)
	}
	s.records = append(s.records, fmt.Sprint(worker, ":", blocks))
	return nil
}

func (s *blockStore) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.records...)
}

// Records keeps decisions only while someone watches, and drops the oldest (counted)
// beyond what one report carries.
func TestRecordsKeepDecisionsOnlyWhileWatchedAndBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	r := NewRecords(m)
	r.Recorded("w0", []uint64{1, 2})
	assert.Empty(t, r.take(), "no one watches: nothing kept")

	r.watch(true)
	r.Recorded("w0", []uint64{1, 2, 3})
	r.Recorded("w1", nil)
	r.Recorded("w1", make([]uint64, MaxRecordBlocks+1))
	got := r.take()
	require.Len(t, got, 1, "empty and oversized records are not kept")
	assert.Equal(t, "w0", got[0].Worker)
	assert.Equal(t, []uint64{1, 2, 3}, got[0].hashes())
	assert.Empty(t, r.take(), "taken once")

	for i := range MaxReportBlocks/1000 + 3 {
		r.Recorded(fmt.Sprint("w", i), make([]uint64, 1000))
	}
	got = r.take()
	assert.Len(t, got, MaxReportBlocks/1000)
	assert.Equal(t, "w3", got[0].Worker, "the oldest dropped first")
	assert.Equal(t, 3.0, testutil.ToFloat64(m.dropped))

	r.Recorded("w0", []uint64{7})
	r.watch(false)
	r.watch(true)
	assert.Empty(t, r.take(), "the last watcher gone: what was kept is dropped")
}

// A watch stream carries each decision's blocks once, in order, in the report after
// it; heartbeats, the first report of a stream and a plain GET carry none. Two
// versions made faster than the watcher reads are both sent: neither's records are
// skipped.
func TestWatchStreamsCarryEachRecordOnce(t *testing.T) {
	ledger := newFakeBookings(map[string]scoring.Load{"w": {ActiveRequests: 1}})
	records := NewRecords(nil)
	opts := testHandlerOptions(nil)
	opts.Records = records
	h := Handler("r1", ledger, opts)
	srv := httptest.NewServer(h)
	defer stopServer(srv)
	lines := watchLines(t, srv.URL)
	require.True(t, lines.Scan())
	first, err := parseReport(lines.Bytes())
	require.NoError(t, err)
	assert.Empty(t, first.Records)

	var want []string
	for i := range 20 {
		records.Recorded(fmt.Sprint("w", i%3), []uint64{uint64(i), uint64(i) + 100})
		want = append(want, fmt.Sprint("w", i%3, ":", []uint64{uint64(i), uint64(i) + 100}))
		if i%4 == 0 {
			ledger.set(map[string]scoring.Load{"w": {ActiveRequests: 1 + i}})
		}
	}
	var got []string
	heartbeats := 0
	deadline := time.Now().Add(waitFor)
	for len(got) < len(want) && time.Now().Before(deadline) {
		require.True(t, lines.Scan())
		r, err := parseReport(lines.Bytes())
		require.NoError(t, err)
		if len(r.Records) == 0 {
			heartbeats++
		}
		for _, rec := range r.Records {
			got = append(got, fmt.Sprint(rec.Worker, ":", rec.hashes()))
		}
	}
	assert.Equal(t, want, got, "every record once, in order")

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", Path, nil))
	assert.NotContains(t, rec.Body.String(), "records", "a plain GET carries none")
	// Heartbeats after the records must not repeat them.
	for range 2 {
		require.True(t, lines.Scan())
		r, err := parseReport(lines.Bytes())
		require.NoError(t, err)
		assert.Empty(t, r.Records, "a heartbeat carries none")
	}
}

// What a replica writes, a replica reads back; what none writes is refused by the key.
func TestReportRecordsRoundTripAndBounds(t *testing.T) {
	line := reportOf("r1", nil, nil, []Record{{Worker: "w0", Blocks: []byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}}})
	r, err := parseReport(line)
	require.NoError(t, err)
	require.Len(t, r.Records, 1)
	assert.Equal(t, []uint64{1, 2}, r.Records[0].hashes())

	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(make([]byte, n)) }
	many := fmt.Sprintf(`{"worker":"w","blocks":%q},{"worker":"w","blocks":%q}`, b64(8*MaxReportBlocks), b64(8))
	for _, tt := range []struct {
		name, records, wantErr string
	}{
		{"no worker", `[{"worker":"","blocks":"` + b64(8) + `"}]`, "records[0]: worker name"},
		{"a long worker name", `[{"worker":"` + strings.Repeat("w", MaxWorkerName+1) + `","blocks":"` + b64(8) + `"}]`, "records[0]: worker name"},
		{"no blocks", `[{"worker":"w","blocks":""}]`, "records[0]: blocks must be"},
		{"part of a hash", `[{"worker":"w","blocks":"` + b64(12) + `"}]`, "records[0]: blocks must be"},
		{"one record too long", `[{"worker":"w","blocks":"` + b64(8*MaxRecordBlocks+8) + `"}]`, "records[0]: blocks must be"},
		{"too many blocks in all", `[` + many + `]`, "records: more than"},
		{"not base64", `[{"worker":"w","blocks":"!!"}]`, "report:"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseReport([]byte(`{"version":1,"replica":"r","workers":[],"records":` + tt.records + `}`))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

// The exchange stores a peer's records in this replica's index, and counts those of a
// worker the index does not know.
func TestExchangeStoresThePeersRecords(t *testing.T) {
	records := NewRecords(nil)
	peer := &fakePeer{ledger: newFakeBookings(map[string]scoring.Load{"w0": {ActiveRequests: 1}})}
	peer.srv = httptest.NewServer(Handler("a", peer.ledger, HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 4, Records: records}))
	t.Cleanup(func() { stopServer(peer.srv) })
	store := &blockStore{known: map[string]bool{"w0": true}}
	metrics := NewMetrics(prometheus.NewRegistry())
	_, ledger := runExchange(t, Config{Addresses: []string{peer.addr()}}, Deps{Blocks: store, Metrics: metrics})
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "watching")
	require.Eventually(t, records.watched.Load, waitFor, pollAt, "the peer sees its watcher")

	records.Recorded("w0", []uint64{5, 6, 7})
	records.Recorded("elsewhere", []uint64{8})
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(metrics.records.WithLabelValues(recordUnknownWorker)) == 1
	}, waitFor, pollAt, "both records heard")
	assert.Equal(t, []string{"w0:[5 6 7]"}, store.got())
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.records.WithLabelValues(recordStored)))
}

// BenchmarkRecorded256Blocks is what peers.share_blocks adds to a decision, under the
// router's decision lock: one record of a 4k-token prompt in blocks of 16 kept for the
// next report (the pending list emptied, not encoded, every 64).
func BenchmarkRecorded256Blocks(b *testing.B) {
	r := NewRecords(nil)
	r.watch(true)
	blocks := make([]uint64, 256)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		r.Recorded("w0", blocks)
		if n++; n%64 == 0 {
			r.mu.Lock()
			r.pending, r.blocks = r.pending[:0], 0
			r.mu.Unlock()
		}
	}
}

// BenchmarkTake64Records is the publisher's side, once per report: 64 kept decisions
// of 256 blocks encoded for the report.
func BenchmarkTake64Records(b *testing.B) {
	r := NewRecords(nil)
	r.watch(true)
	blocks := make([]uint64, 256)
	b.ReportAllocs()
	for b.Loop() {
		for range 64 {
			r.Recorded("w0", blocks)
		}
		r.take()
	}
}

// BenchmarkParseReportWith64Records is the reading side of one report carrying 64
// decisions of 256 blocks each (a busy 10 ms at 6,400 decisions a second): parsed
// and decoded, not stored.
func BenchmarkParseReportWith64Records(b *testing.B) {
	records := make([]Record, 64)
	for i := range records {
		records[i] = Record{Worker: fmt.Sprint("vllm-", i%8), Blocks: make([]byte, 8*256)}
	}
	line := reportOf(NewReplicaID(), busyWorkers64(), nil, records)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		r, err := parseReport(line)
		if err != nil {
			b.Fatal(err)
		}
		for _, rec := range r.Records {
			_ = rec.hashes()
		}
	}
}
