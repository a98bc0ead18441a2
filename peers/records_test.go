package peers

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
)

// blockStore is an index that records what it is told, and knows some workers, at
// addresses when given.
type blockStore struct {
	mu        sync.Mutex
	known     map[string]bool
	addresses map[string]string // a worker's current address; absent: not checked
	records   []string          // "worker:hashes"
}

func (s *blockStore) StoreRecord(worker, address string, blocks []uint64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.known[worker] {
		return false, fmt.Errorf("unknown worker %q", worker)
	}
	if current, ok := s.addresses[worker]; ok && address != "" && current != address {
		return true, nil
	}
	if len(blocks) == 0 {
		return false, nil
	}
	s.records = append(s.records, fmt.Sprint(worker, ":", blocks))
	return false, nil
}

func (s *blockStore) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.records...)
}

// sealedHashes returns the records sealed after after, decoded, as "worker:hashes".
func sealedHashes(t *testing.T, r *Records, after uint64) []string {
	t.Helper()
	raws, _, _ := r.since(after, r.newest())
	var out []string
	for _, raw := range raws {
		rep, err := parseReport(withRecords(reportLine("r", nil, nil), 16, 1, 0, [][]byte{raw}))
		require.NoError(t, err)
		out = append(out, fmt.Sprint(rep.Records[0].Worker, ":", rep.Records[0].hashes()))
	}
	return out
}

// Records keeps decisions only while someone watches (and for a grace after the last
// leaves), numbers them when sealed, cuts a record to MaxRecordBlocks, and drops the
// oldest (counted) beyond what is kept between two reports.
func TestRecordsKeepDecisionsWhileWatchedAndBounded(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	r := NewRecords(m)
	r.Recorded("w0", "", []uint64{1, 2}, "")
	assert.Zero(t, r.seal(), "no one watches: nothing kept")

	r.join()
	r.Recorded("w0", "", []uint64{1, 2, 3}, "")
	r.Recorded("w1", "", nil, "")
	r.Recorded("w2", "", make([]uint64, MaxRecordBlocks+5), "")
	assert.Equal(t, uint64(2), r.seal(), "an empty record is not kept; a long one is cut")
	raws, first, sealed := r.since(0, 2)
	require.Len(t, raws, 2)
	assert.Equal(t, uint64(1), first)
	assert.False(t, sealed.IsZero(), "the first record's seal time")
	assert.Equal(t, []string{"w0:[1 2 3]"}, sealedHashes(t, r, 0)[:1])
	rep, err := parseReport(withRecords(reportLine("r", nil, nil), 16, 2, 0, raws[1:]))
	require.NoError(t, err)
	assert.Len(t, rep.Records[0].hashes(), MaxRecordBlocks, "the record's first MaxRecordBlocks blocks")

	for i := range maxPendingBlocks/1000 + 3 {
		r.Recorded(fmt.Sprint("w", i), "", make([]uint64, 1000), "")
	}
	assert.Equal(t, 3.0, testutil.ToFloat64(m.dropped), "the oldest dropped first")
	newest := r.seal()
	assert.Equal(t, uint64(2+maxPendingBlocks/1000), newest)
	assert.Equal(t, "w3:", sealedHashes(t, r, 2)[0][:3])
}

// A record is numbered once; a stream asks for those after its cursor and gets them in
// lines of at most MaxReportRecordBytes; what was forgotten (past maxSealedBytes) is
// reported as missed.
func TestRecordsSinceResumesAndBoundsLines(t *testing.T) {
	r := NewRecords(nil)
	r.join()
	big := make([]uint64, MaxRecordBlocks) // ~350 KB encoded each
	var newest uint64
	for range 3 {
		r.Recorded("w", "", big, "")
		newest = r.seal()
	}
	require.Equal(t, uint64(3), newest)
	raws, first, _ := r.since(0, newest)
	assert.Len(t, raws, 1, "two of these exceed one line's bytes")
	assert.Equal(t, uint64(1), first)
	raws, first, _ = r.since(1, newest)
	assert.Equal(t, uint64(2), first)
	assert.Len(t, raws, 1)
	raws, _, _ = r.since(3, newest)
	assert.Empty(t, raws, "nothing after the newest")

	for range maxSealedBytes / (350 << 10) {
		r.Recorded("w", "", big, "")
		newest = r.seal()
	}
	raws, first, _ = r.since(0, newest)
	assert.Greater(t, first, uint64(1), "the oldest were forgotten")
	assert.NotEmpty(t, raws)
}

// Many short records make a line no longer than a peer accepts (helper-36's review:
// 32,768 one-block records once made a 2.1 MB line, which peers refused).
func TestALineOfShortRecordsIsOneThePeersAccept(t *testing.T) {
	r := NewRecords(nil)
	r.join()
	for i := range maxPendingBlocks {
		r.Recorded("vllm-decode-0.vllm.llm.svc", "", []uint64{uint64(i)}, "")
	}
	newest := r.seal()
	var after uint64
	lines := 0
	for after < newest {
		raws, first, _ := r.since(after, newest)
		line := withRecords(reportLine("r1", busyWorkers64(), nil), 16, first, 0, raws)
		got, err := parseReport(line)
		require.NoError(t, err, "a line of %d bytes", len(line))
		require.Equal(t, first, got.RecordsFrom)
		after = first + uint64(len(raws)) - 1
		lines++
	}
	assert.Greater(t, lines, 1, "spread over several lines")
}

// The records kept for a stream that left stay for recordGrace, so a renewed stream
// resumes; then they are forgotten.
func TestRecordsOutliveTheLastWatcherForAGrace(t *testing.T) {
	r := NewRecords(nil)
	r.join()
	r.leave()
	r.Recorded("w", "", []uint64{1}, "")
	assert.Equal(t, uint64(1), r.seal(), "kept within the grace")
	r.mu.Lock()
	first := r.grace
	r.mu.Unlock()
	require.NotNil(t, first, "the last watcher left: the grace runs")
	r.join() // the stream is back: the grace timer is stopped
	r.mu.Lock()
	stopped := r.grace == nil && !first.Stop() // Stop reports false: join stopped it
	r.mu.Unlock()
	assert.True(t, stopped, "a watcher joined: the grace timer is stopped and forgotten")
	assert.True(t, r.watched.Load())
	r.leave()
	r.mu.Lock()
	grace := r.grace
	r.mu.Unlock()
	require.NotNil(t, grace)
	assert.NotSame(t, first, grace, "the grace starts again when the stream leaves again")
}

// A watch stream that asks for records gets each once, in order, in the reports after
// it; heartbeats and a plain GET carry none, nor does a stream that does not ask.
func TestWatchStreamsCarryEachRecordOnce(t *testing.T) {
	ledger := newFakeBookings(map[string]scoring.Load{"w": {ActiveRequests: 1}})
	records := NewRecords(nil)
	opts := testHandlerOptions(nil)
	opts.Records, opts.BlockSize = records, 16
	h := Handler("r1", ledger, opts)
	srv := httptest.NewServer(h)
	defer stopServer(srv)
	lines := watchLinesAt(t, srv.URL+Path+"?watch&records")
	plainLines := watchLinesAt(t, srv.URL+Path+"?watch")
	require.True(t, lines.Scan())
	require.True(t, plainLines.Scan())

	var want []string
	for i := range 20 {
		records.Recorded(fmt.Sprint("w", i%3), "", []uint64{uint64(i), uint64(i) + 100}, "")
		want = append(want, fmt.Sprint("w", i%3, ":", []uint64{uint64(i), uint64(i) + 100}))
		if i%4 == 0 {
			ledger.set(map[string]scoring.Load{"w": {ActiveRequests: 1 + i}})
		}
	}
	var got []string
	next := uint64(1)
	deadline := time.Now().Add(waitFor)
	for len(got) < len(want) && time.Now().Before(deadline) {
		require.True(t, lines.Scan())
		r, err := parseReport(lines.Bytes())
		require.NoError(t, err)
		if len(r.Records) > 0 {
			assert.Equal(t, next, r.RecordsFrom, "numbered in order, none twice")
			assert.Equal(t, 16, r.BlockSize)
			next += uint64(len(r.Records))
		}
		for _, rec := range r.Records {
			got = append(got, fmt.Sprint(rec.Worker, ":", rec.hashes()))
		}
	}
	assert.Equal(t, want, got, "every record once, in order")
	for range 2 {
		require.True(t, lines.Scan())
		r, err := parseReport(lines.Bytes())
		require.NoError(t, err)
		assert.Empty(t, r.Records, "a heartbeat carries none")
	}
	for range 3 {
		require.True(t, plainLines.Scan())
		assert.NotContains(t, plainLines.Text(), "records", "a stream that did not ask")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", Path, nil))
	assert.NotContains(t, rec.Body.String(), "records", "a plain GET carries none")
}

// A stream that stops reading holds its cursor, not the reports it has not sent
// (helper-36's review: following every version pinned 61 MB after 200 versions).
func TestAStalledWatcherPinsNoHistory(t *testing.T) {
	ledger := newFakeBookings(map[string]scoring.Load{"w": {ActiveRequests: 1}})
	records := NewRecords(nil)
	opts := testHandlerOptions(nil)
	opts.Records, opts.BlockSize = records, 16
	opts.WriteTimeout, opts.MaxStreamAge = 30*time.Second, time.Minute
	h := Handler("r1", ledger, opts)
	srv := httptest.NewServer(h)
	defer stopServer(srv)
	resp, err := http.Get(srv.URL + Path + "?watch&records") // then not read
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Eventually(t, records.watched.Load, waitFor, pollAt)

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	blocks := make([]uint64, MaxRecordBlocks)
	for range 200 {
		records.Recorded("w", "", blocks, "")
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", Path, nil)) // a version now
	}
	time.Sleep(200 * time.Millisecond) // the stream writes what the socket buffers take
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	retained := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	assert.Less(t, retained, int64(maxSealedBytes+8<<20), "a stalled watcher pins %d MB", retained>>20)
}

// What a replica writes, a replica reads back; what none writes is refused by the key.
func TestReportRecordsRoundTripAndBounds(t *testing.T) {
	line := withRecords(reportLine("r1", nil, nil), 16, 7, 0, [][]byte{[]byte(`{"worker":"w0","blocks":"AQAAAAAAAAACAAAAAAAAAA=="}`)})
	r, err := parseReport(line)
	require.NoError(t, err)
	require.Len(t, r.Records, 1)
	assert.Equal(t, []uint64{1, 2}, r.Records[0].hashes())
	assert.Equal(t, uint64(7), r.RecordsFrom)

	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(make([]byte, n)) }
	for _, tt := range []struct {
		name, head, records, wantErr string
	}{
		{"no worker", `"block_size":16,"records_from":1`, `[{"worker":"","blocks":"` + b64(8) + `"}]`, "records[0]: worker name"},
		{"a long worker name", `"block_size":16,"records_from":1`, `[{"worker":"` + strings.Repeat("w", MaxWorkerName+1) + `","blocks":"` + b64(8) + `"}]`, "records[0]: worker name"},
		{"no blocks", `"block_size":16,"records_from":1`, `[{"worker":"w","blocks":""}]`, "records[0]: blocks must be"},
		{"part of a hash", `"block_size":16,"records_from":1`, `[{"worker":"w","blocks":"` + b64(12) + `"}]`, "records[0]: blocks must be"},
		{"a record too long", `"block_size":16,"records_from":1`, `[{"worker":"w","blocks":"` + b64(8*MaxRecordBlocks+8) + `"}]`, "records[0]: blocks must be"},
		{"not base64", `"block_size":16,"records_from":1`, `[{"worker":"w","blocks":"!!"}]`, "report:"},
		{"no numbering", `"block_size":16`, `[{"worker":"w","blocks":"` + b64(8) + `"}]`, "records_from"},
		{"no block size", `"records_from":1`, `[{"worker":"w","blocks":"` + b64(8) + `"}]`, "block_size"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseReport([]byte(`{"version":1,"replica":"r","workers":[],` + tt.head + `,"records":` + tt.records + `}`))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

// recordsPeer serves a fake peer "a" whose decisions are records.
func recordsPeer(t *testing.T, blockSize int, maxStreamAge time.Duration) (*fakePeer, *Records) {
	t.Helper()
	records := NewRecords(nil)
	peer := &fakePeer{ledger: newFakeBookings(map[string]scoring.Load{"w0": {ActiveRequests: 1}})}
	peer.srv = httptest.NewServer(Handler("a", peer.ledger, HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 4,
		MaxStreamAge: maxStreamAge, Records: records, BlockSize: blockSize}))
	t.Cleanup(func() { stopServer(peer.srv) })
	return peer, records
}

// The exchange stores a peer's records in this replica's index, and counts those of a
// worker the index does not know, and those made with another block size.
func TestExchangeStoresThePeersRecords(t *testing.T) {
	for _, tt := range []struct {
		name          string
		peerBlockSize int
		want          []string
		wantResult    string
	}{
		{"same block size", 16, []string{"w0:[5 6 7]"}, recordStored},
		{"another block size", 64, nil, recordOtherBlockSize},
	} {
		t.Run(tt.name, func(t *testing.T) {
			peer, records := recordsPeer(t, tt.peerBlockSize, 0)
			store := &blockStore{known: map[string]bool{"w0": true}}
			metrics := NewMetrics(prometheus.NewRegistry())
			_, ledger := runExchange(t, Config{Addresses: []string{peer.addr()}}, Deps{Blocks: store, BlockSize: 16, Metrics: metrics})
			eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "watching")
			require.Eventually(t, records.watched.Load, waitFor, pollAt, "the peer sees its watcher")

			records.Recorded("w0", "", []uint64{5, 6, 7}, "")
			records.Recorded("elsewhere", "", []uint64{8}, "")
			require.Eventually(t, func() bool {
				return testutil.ToFloat64(metrics.records.WithLabelValues(tt.wantResult)) >= 1
			}, waitFor, pollAt, "the records heard")
			assert.Equal(t, tt.want, store.got())
			if tt.wantResult == recordStored {
				assert.Eventually(t, func() bool { return testutil.ToFloat64(metrics.records.WithLabelValues(recordUnknownWorker)) == 1 }, waitFor, pollAt)
			}
		})
	}
}

// TestARecordForAWorkersOldAddressIsNotStored: a record made when the worker was at an
// address it has left since here (a pod restarted at a new IP under its name, its
// index cleared) credits the new engine with nothing, nor its session; one from a
// replica that sends no address is stored as before.
func TestARecordForAWorkersOldAddressIsNotStored(t *testing.T) {
	peer, records := recordsPeer(t, 16, 0)
	store := &blockStore{known: map[string]bool{"w0": true}, addresses: map[string]string{"w0": "10.0.0.2:8000"}}
	sessions := &sessionStore{worker: map[uint64]string{}}
	metrics := NewMetrics(prometheus.NewRegistry())
	runExchange(t, Config{Addresses: []string{peer.addr()}}, Deps{Blocks: store, BlockSize: 16, Sessions: sessions, Metrics: metrics})
	require.Eventually(t, records.watched.Load, waitFor, pollAt, "the peer sees its watcher")

	records.Recorded("w0", "10.0.0.1:8000", []uint64{1, 2}, "conv-old") // the old engine's
	records.Recorded("w0", "10.0.0.2:8000", []uint64{3, 4}, "")         // the new one's
	records.Recorded("w0", "", []uint64{5, 6}, "")                      // a replica that does not say
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(metrics.records.WithLabelValues(recordStored)) == 2
	}, waitFor, pollAt, "the records heard")
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.records.WithLabelValues(recordMovedWorker)))
	assert.Equal(t, []string{"w0:[3 4]", "w0:[5 6]"}, store.got())
	assert.Empty(t, sessions.get(session.Key("conv-old")), "the old engine's session is not the new one's")
}

// A replica heard at two addresses sends each record on both streams: it is stored
// once (helper-36's review).
func TestARecordFromAReplicaAtTwoAddressesIsStoredOnce(t *testing.T) {
	peer, records := recordsPeer(t, 16, 0)
	_, port, err := net.SplitHostPort(peer.addr())
	require.NoError(t, err)
	store := &blockStore{known: map[string]bool{"w0": true}}
	metrics := NewMetrics(prometheus.NewRegistry())
	e, _ := runExchange(t, Config{Addresses: []string{peer.addr(), "localhost:" + port}}, Deps{Blocks: store, BlockSize: 16, Metrics: metrics})
	require.Eventually(t, func() bool { return len(e.Peers()) == 2 }, waitFor, pollAt, "both addresses watched")
	require.Eventually(t, func() bool {
		records.mu.Lock()
		defer records.mu.Unlock()
		return records.watchers == 2
	}, waitFor, pollAt, "both streams open")

	records.Recorded("w0", "", []uint64{5, 6, 7}, "")
	// The first stream stores the record after it lets go of the exchange's lock, so the
	// second may count its copy a duplicate before the first has stored it: wait for both.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(metrics.records.WithLabelValues(recordDuplicate)) == 1 &&
			testutil.ToFloat64(metrics.records.WithLabelValues(recordStored)) == 1
	}, waitFor, pollAt, "heard on both streams")
	assert.Equal(t, []string{"w0:[5 6 7]"}, store.got(), "one decision, stored once")
}

// Streams renewed every 400 ms (as every minute in production) lose no record: the
// watcher resumes after the last one it got (helper-36's review: 93 of 1,500 were lost
// at each renewal's gap).
func TestRenewedStreamsLoseNoRecords(t *testing.T) {
	peer, records := recordsPeer(t, 16, healthyStream+100*time.Millisecond)
	store := &blockStore{known: map[string]bool{"w0": true}}
	runExchange(t, Config{Addresses: []string{peer.addr()}}, Deps{Blocks: store, BlockSize: 16, Metrics: NewMetrics(prometheus.NewRegistry())})
	require.Eventually(t, records.watched.Load, waitFor, pollAt, "the peer sees its watcher")

	const n = 600
	for i := range n {
		records.Recorded("w0", "", []uint64{uint64(i)}, "")
		time.Sleep(2 * time.Millisecond) // over several renewals
	}
	require.Eventually(t, func() bool { return len(store.got()) >= n }, waitFor, pollAt, "lost %d", n-len(store.got()))
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprint("w0:", []uint64{uint64(i)})
	}
	assert.Equal(t, want, store.got(), "each once, in order")
}

// BenchmarkRecorded256Blocks is what peers.share_blocks adds to a decision, under the
// router's decision lock: one record of a 4k-token prompt in blocks of 16 kept for the
// next report (the kept list emptied, not encoded, every 64).
func BenchmarkRecorded256Blocks(b *testing.B) {
	r := NewRecords(nil)
	r.join()
	blocks := make([]uint64, 256)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		r.Recorded("w0", "", blocks, "")
		if n++; n%64 == 0 { // a report takes them, as seal does, without encoding them
			pending := r.take()
			r.mu.Lock()
			r.recycle(pending)
			r.mu.Unlock()
		}
	}
}

// BenchmarkReportWith64Records is the sending side, once per report: 64 kept decisions
// of 256 blocks sealed (encoded, once for every watcher), and one watcher's line made
// from them and the loads of 64 busy workers.
func BenchmarkReportWith64Records(b *testing.B) {
	r := NewRecords(nil)
	r.join()
	blocks := make([]uint64, 256)
	plain := reportLine(NewReplicaID(), busyWorkers64(), nil)
	b.ReportAllocs()
	for b.Loop() {
		after := r.newest()
		for range 64 {
			r.Recorded("vllm-0", "", blocks, "")
		}
		newest := r.seal()
		raws, first, _ := r.since(after, newest)
		_ = withRecords(plain, 16, first, 0, raws)
	}
}

// BenchmarkParseReportWith64Records is the reading side of one report carrying 64
// decisions of 256 blocks each (a busy 10 ms at 6,400 decisions a second): parsed
// and decoded, not stored.
func BenchmarkParseReportWith64Records(b *testing.B) {
	r := NewRecords(nil)
	r.join()
	for i := range 64 {
		r.Recorded(fmt.Sprint("vllm-", i%8), "", make([]uint64, 256), "")
	}
	raws, first, _ := r.since(0, r.seal())
	line := withRecords(reportLine(NewReplicaID(), busyWorkers64(), nil), 16, first, 0, raws)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		rep, err := parseReport(line)
		if err != nil {
			b.Fatal(err)
		}
		for _, rec := range rep.Records {
			_ = rec.hashes()
		}
	}
}

// sessionStore remembers the sessions it is told of.
type sessionStore struct {
	mu     sync.Mutex
	worker map[uint64]string
}

func (s *sessionStore) RememberKey(key uint64, worker string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.worker[key] = worker
}

func (s *sessionStore) get(key uint64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.worker[key]
}

// A decision's session goes with its record, as the key of its id (not the id): the
// watcher remembers the worker as the session's last, also for a request without a
// prompt (a record of the session alone).
func TestExchangeRemembersThePeersSessions(t *testing.T) {
	peer, records := recordsPeer(t, 16, 0)
	store := &blockStore{known: map[string]bool{"w0": true, "w1": true}}
	sessions := &sessionStore{worker: map[uint64]string{}}
	_, ledger := runExchange(t, Config{Addresses: []string{peer.addr()}}, Deps{Blocks: store, BlockSize: 16, Sessions: sessions})
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "watching")
	require.Eventually(t, records.watched.Load, waitFor, pollAt, "the peer sees its watcher")

	records.Recorded("w0", "", []uint64{5, 6}, "conv-1")
	records.Recorded("w1", "", nil, "conv-2")
	records.Recorded("w1", "", nil, "") // nothing to tell
	require.Eventually(t, func() bool { return sessions.get(session.Key("conv-2")) != "" }, waitFor, pollAt)
	assert.Equal(t, "w0", sessions.get(session.Key("conv-1")))
	assert.Equal(t, "w1", sessions.get(session.Key("conv-2")))
	assert.Equal(t, []string{"w0:[5 6]"}, store.got(), "a session alone stores no blocks")

	raws, _, _ := records.since(0, records.newest())
	for _, raw := range raws {
		assert.NotContains(t, string(raw), "conv-", "the id itself is not sent")
	}
}

// A stored Responses API response goes with a record of its own, by its key (not its
// id): the watcher remembers its worker in its store of responses, not of sessions,
// and keeps it when the record comes late (a stored response does not move, where a
// session may have).
func TestExchangeRemembersThePeersStoredResponses(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprint("late=", late), func(t *testing.T) {
			key := session.ResponseKey("resp_1")
			rec := fmt.Sprintf(`{"worker":"w0","blocks":"","session":%d,"response":true}`, key)
			age := 5 * time.Millisecond
			if late {
				age = 5 * time.Second
			}
			line := withRecords(reportLine("a", map[string]scoring.Load{"w0": {ActiveRequests: 1}}, nil), 16, 1, age, [][]byte{[]byte(rec)})
			peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write(line)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}))
			t.Cleanup(func() { stopServer(peer) })
			store := &blockStore{known: map[string]bool{"w0": true}}
			sessions := &sessionStore{worker: map[uint64]string{}}
			responses := &sessionStore{worker: map[uint64]string{}}
			runExchange(t, Config{Addresses: []string{strings.TrimPrefix(peer.URL, "http://")}},
				Deps{Blocks: store, BlockSize: 16, Sessions: sessions, Responses: responses})
			require.Eventually(t, func() bool { return responses.get(key) == "w0" }, waitFor, pollAt)
			assert.Empty(t, sessions.get(key), "not a session")
			assert.Empty(t, store.got(), "no blocks")
		})
	}
}

// RecordedResponse seals a record that names the response by its key alone, and that a
// replica before it reads as a valid record (a session's key, which no header names).
func TestRecordedResponsesAreSealedAsRecordsOfTheirKey(t *testing.T) {
	r := NewRecords(nil)
	r.join()
	r.RecordedResponse("w0", "10.0.0.1:8000", session.ResponseKey("resp_1"))
	r.RecordedResponse("w0", "10.0.0.1:8000", 0) // nothing to tell
	r.seal()
	raws, _, _ := r.since(0, r.newest())
	require.Len(t, raws, 1)
	assert.NotContains(t, string(raws[0]), "resp_1", "the id itself is not sent")
	var rec Record
	require.NoError(t, json.Unmarshal(raws[0], &rec))
	assert.Equal(t, Record{Worker: "w0", Address: "10.0.0.1:8000", Blocks: []byte{}, Session: session.ResponseKey("resp_1"), Response: true}, rec)
	report := Report{Version: Version, Replica: "a", BlockSize: 16, RecordsFrom: 1, Records: []Record{rec}}
	assert.NoError(t, report.checkRecords(), "a record of a key alone, as a session's")
	assert.NotEqual(t, session.Key("resp_1"), session.ResponseKey("resp_1"), "a session id cannot name a response")
}

// A record of a session alone names a worker too: one this replica does not know (a
// fleet being reloaded, another pool) is counted and skipped, as a record with blocks
// is, and its session is not remembered (review-38).
func TestASessionAloneOfAnUnknownWorkerIsSkipped(t *testing.T) {
	peer, records := recordsPeer(t, 16, 0)
	store := &blockStore{known: map[string]bool{"w0": true}}
	sessions := &sessionStore{worker: map[uint64]string{}}
	metrics := NewMetrics(prometheus.NewRegistry())
	_, ledger := runExchange(t, Config{Addresses: []string{peer.addr()}}, Deps{Blocks: store, BlockSize: 16, Sessions: sessions, Metrics: metrics})
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "watching")
	require.Eventually(t, records.watched.Load, waitFor, pollAt, "the peer sees its watcher")

	records.Recorded("elsewhere", "", []uint64{8}, "conv-1")
	records.Recorded("elsewhere", "", nil, "conv-2")
	records.Recorded("w0", "", nil, "conv-3") // the last: once it is remembered, all were heard
	require.Eventually(t, func() bool { return sessions.get(session.Key("conv-3")) == "w0" }, waitFor, pollAt)
	assert.Empty(t, sessions.get(session.Key("conv-1")), "a record of blocks on an unknown worker")
	assert.Empty(t, sessions.get(session.Key("conv-2")), "a record of a session alone on an unknown worker")
	assert.Equal(t, 2.0, testutil.ToFloat64(metrics.records.WithLabelValues(recordUnknownWorker)))
	assert.Equal(t, 1.0, testutil.ToFloat64(metrics.records.WithLabelValues(recordStored)))
}

// Between two seals (and for recordGrace after the last watcher left, when nothing
// seals) the records kept are bounded: records of a session alone too, which hold no
// block (review-38).
func TestRecordsOfSessionsAloneAreBounded(t *testing.T) {
	r := NewRecords(nil)
	r.join()
	r.leave() // the grace: still kept, and no publisher seals them
	for i := range maxPendingBlocks + 1000 {
		r.Recorded("w0", "", nil, fmt.Sprint("conv-", i))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	assert.LessOrEqual(t, len(r.pending), maxPendingBlocks)
}

// Records sent late (a stream resumed after an outage: records_age_ms past
// stale_after) keep their blocks but not their sessions, which a newer decision may
// have moved since (helper-38's review); fresh ones keep both.
func TestLateRecordsKeepTheirBlocksNotTheirSessions(t *testing.T) {
	for _, tt := range []struct {
		name        string
		age         time.Duration
		ageMs       int64 // when not 0, the records_age_ms sent in place of age's
		wantSession bool
	}{
		{"fresh", 5 * time.Millisecond, 0, true},
		{"sent after an outage", 5 * time.Second, 0, false},
		// Past what a time.Duration holds in milliseconds (292 years): a buggy or
		// hostile peer's age wrapped negative and the sessions were taken as fresh.
		{"an age past a Duration's range", 5 * time.Millisecond, math.MaxInt64/1_000_000 + 1, false},
		{"the largest age", 5 * time.Millisecond, math.MaxInt64, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := fmt.Sprintf(`{"worker":"w0","blocks":"BQAAAAAAAAA=","session":%d}`, session.Key("conv-1"))
			line := withRecords(reportLine("a", map[string]scoring.Load{"w0": {ActiveRequests: 1}}, nil), 16, 1, tt.age, [][]byte{[]byte(rec)})
			if tt.ageMs != 0 {
				line = bytes.Replace(line, []byte(`"records_age_ms":5,`), fmt.Appendf(nil, `"records_age_ms":%d,`, tt.ageMs), 1)
			}
			peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write(line)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}))
			t.Cleanup(func() { stopServer(peer) })
			store := &blockStore{known: map[string]bool{"w0": true}}
			sessions := &sessionStore{worker: map[uint64]string{}}
			metrics := NewMetrics(prometheus.NewRegistry())
			runExchange(t, Config{Addresses: []string{strings.TrimPrefix(peer.URL, "http://")}}, Deps{Blocks: store, BlockSize: 16, Sessions: sessions, Metrics: metrics})
			// Counted once the record is through (its session remembered or not): the
			// blocks alone are stored before the session is.
			require.Eventually(t, func() bool { return testutil.ToFloat64(metrics.records.WithLabelValues(recordStored)) == 1 }, waitFor, pollAt, "the record is heard")
			assert.Equal(t, []string{"w0:[5]"}, store.got())
			if tt.wantSession {
				assert.Equal(t, "w0", sessions.get(session.Key("conv-1")))
			} else {
				assert.Empty(t, sessions.get(session.Key("conv-1")))
			}
		})
	}
}

// GET /peers says which replicas this one hears from, whether their load counts, and
// where their records stand; without an exchange it lists none.
func TestStatusHandlerSaysWhichPeersAreHeard(t *testing.T) {
	peer, records := recordsPeer(t, 16, 0)
	store := &blockStore{known: map[string]bool{"w0": true}}
	cfg := Config{Addresses: []string{peer.addr()}, ShareBlocks: true}
	e, ledger := runExchange(t, cfg, Deps{Blocks: store, BlockSize: 16})
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "watching")
	require.Eventually(t, records.watched.Load, waitFor, pollAt)
	records.Recorded("w0", "", []uint64{1}, "")
	records.Recorded("w0", "", []uint64{2}, "")
	require.Eventually(t, func() bool { return len(store.got()) == 2 }, waitFor, pollAt)

	type status struct {
		Replica     string       `json:"replica"`
		ShareBlocks bool         `json:"share_blocks"`
		Peers       []PeerStatus `json:"peers"`
	}
	get := func(h http.Handler) status {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/peers", nil))
		require.Equal(t, http.StatusOK, rec.Code)
		assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		var st status
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &st))
		return st
	}
	st := get(StatusHandler("me", cfg, e))
	assert.Equal(t, "me", st.Replica)
	assert.True(t, st.ShareBlocks)
	require.Len(t, st.Peers, 1)
	assert.Equal(t, peer.addr(), st.Peers[0].Address)
	assert.Equal(t, "a", st.Peers[0].Replica)
	assert.True(t, st.Peers[0].Live)
	assert.Equal(t, uint64(2), st.Peers[0].RecordsAfter)

	none := get(StatusHandler("me", Config{}, nil))
	assert.Empty(t, none.Peers)
	assert.NotNil(t, none.Peers, "an empty list, not null")
}

// A watch line carries the loads and the records: with many busy workers (4,000 named
// like pods, within MaxReportWorkers) the loads alone are about 600 KB, and records up
// to MaxReportRecordBytes on top made a line past MaxReportBytes, which the watcher
// refused and dropped the stream for, and the reopened stream resumed with the same
// records: no load nor record of this replica ever counted again.
func TestALineWithManyBusyWorkersAndRecordsIsOneThePeersAccept(t *testing.T) {
	loads := make(map[string]scoring.Load, 4000)
	for i := range 4000 {
		loads[fmt.Sprintf("vllm-llama-3-70b-instruct-decode-%04d.vllm-workers.inference-prod.svc", i)] = scoring.Load{
			PrefillTokens: 123456, ActiveRequests: 12, PendingRequests: 3}
	}
	records := NewRecords(nil)
	srv := httptest.NewServer(Handler("r1", newFakeBookings(loads), HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat,
		MaxWatchers: 1, Records: records, BlockSize: 16}))
	defer stopServer(srv)
	resp, err := http.Get(srv.URL + Path + "?watch&records")
	require.NoError(t, err)
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 4*MaxReportBytes)
	require.True(t, lines.Scan(), "the first report")
	require.Greater(t, len(lines.Bytes()), 500_000, "the loads alone")
	blocks := make([]uint64, 128)
	// ~1.4 KB encoded each: 560 KB, more than one line's records, and 51,200 blocks,
	// within what is kept between two reports.
	for i := range 400 {
		blocks[0] = uint64(i)
		records.Recorded("w", "", slices.Clone(blocks), "")
	}
	got := 0
	for got < 400 && lines.Scan() {
		r, err := parseReport(lines.Bytes())
		require.NoError(t, err, "a line of %d bytes", len(lines.Bytes()))
		got += len(r.Records)
	}
	assert.Equal(t, 400, got, "every record, in lines a peer accepts")
}

// since is sinceWithin at the bound a line without loads allows.
func (r *Records) since(after, upTo uint64) (raws [][]byte, first uint64, sealed time.Time) {
	return r.sinceWithin(after, upTo, MaxReportRecordBytes)
}
