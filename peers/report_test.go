package peers

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
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
	mu        sync.Mutex
	loads     map[string]scoring.Load
	adapters  map[string]map[string]int
	histories map[string]scoring.History
	version   uint64
}

// reportLine is reportOf's line of loads and adapters, without prefill histories.
func reportLine(replica string, loads map[string]scoring.Load, adapters map[string]map[string]int) []byte {
	line, _ := reportOf(replica, loads, adapters, nil)
	return line
}

func (f *fakeBookings) PrefillHistories() map[string]scoring.History {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.histories)
}

func newFakeBookings(loads map[string]scoring.Load) *fakeBookings { return &fakeBookings{loads: loads} }

func (f *fakeBookings) LoadsWithAdapters() (map[string]scoring.Load, map[string]map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.loads), maps.Clone(f.adapters)
}

// setAdapters replaces the resident adapters, a new version.
func (f *fakeBookings) setAdapters(adapters map[string]map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.adapters, f.version = adapters, f.version+1
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
	first := []WorkerLoad{{Worker: "w", ActiveRequests: 1}}
	assert.Equal(t, first, next(), "the report at once")
	ledger.set(map[string]scoring.Load{"w": {ActiveRequests: 2, PendingRequests: 1, PrefillTokens: 64}})
	// A loaded machine may stall past a heartbeat before the change is made: heartbeats
	// of the first report may come before it, for up to waitFor.
	change := next()
	for range waitFor / Heartbeat {
		if !reflect.DeepEqual(change, first) {
			break
		}
		change = next()
	}
	assert.Equal(t, []WorkerLoad{{Worker: "w", ActiveRequests: 2, PendingRequests: 1, PrefillTokens: 64}}, change, "the change")
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
	adapters := make([]string, MaxWorkerAdapters+1)
	for i := range adapters {
		adapters[i] = fmt.Sprintf(`"a%d":0`, i)
	}
	manyAdapters := strings.Join(adapters, ",")
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
		{"adapter requests above active", worker(`,"active_requests":1,"adapters":{"sql":2}`), `workers[0].adapters["sql"]: must be in [0, active_requests 1]`},
		{"negative adapter requests", worker(`,"adapters":{"sql":-1}`), `workers[0].adapters["sql"]`},
		{"empty adapter name", worker(`,"adapters":{"":0}`), "workers[0].adapters: a name"},
		{"long adapter name", worker(`,"adapters":{"` + strings.Repeat("a", MaxAdapterName+1) + `":0}`), "workers[0].adapters: a name"},
		{"too many adapters", worker(`,"adapters":{` + manyAdapters + `}`), "workers[0].adapters: 257, at most 256"},
		{"a repeated adapter", worker(`,"adapters":{"sql":0,"sql":0}`), "duplicate"},
		{"trailing data", `{"version":1,"replica":"r"} {}`, "after top-level value"},
		{"a repeated member", `{"version":1,"replica":"r","workers":[],"workers":[{"worker":"w","active_requests":9}]}`, "duplicate"},
		{"a repeated count", worker(`,"active_requests":1,"active_requests":-1`), "duplicate"},
		{"invalid UTF-8", "{\"version\":1,\"replica\":\"r\xff\"}", "UTF-8"},
		{"the version under another case", `{"Version":1,"replica":"r"}`, "version 0"},
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
	f.Add([]byte(`{"version":1,"replica":"r","workers":[{"worker":"w","active_requests":2,"adapters":{"sql":2,"chat":0}}]}`))
	f.Add([]byte(`{"version":1,"replica":"r","workers":[{"worker":"w","active_requests":-1}]}`))
	f.Add([]byte(`{"version":1,"replica":"r","workers":[],"block_size":16,"records_from":3,"records":[{"worker":"w","blocks":"AQAAAAAAAAACAAAAAAAAAA=="}]}`))
	f.Add([]byte(`{"version":1,"replica":"r","workers":[],"block_size":16,"records_from":1,"records":[{"worker":"w","blocks":"AQAAAA=="}]}`))
	f.Add([]byte(`{"version":1,"replica":"r","workers":[],"block_size":16,"records_from":9,"records":[{"worker":"w","blocks":"","session":18446744073709551615}]}`))
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
		for _, rec := range r.Records {
			n := len(rec.hashes())
			require.True(t, (n >= 1 || rec.Session != 0) && n <= MaxRecordBlocks && len(rec.Blocks) == 8*n, "record of %d bytes", len(rec.Blocks))
			require.NotEmpty(t, rec.Worker)
		}
		if len(r.Records) > 0 {
			require.True(t, r.RecordsFrom >= 1 && r.BlockSize >= 1 && r.BlockSize <= maxBlockSize)
		}
	})
}

// busyWorkers64 is the load of 64 busy workers, named like pods.
func busyWorkers64() map[string]scoring.Load {
	loads := map[string]scoring.Load{}
	for i := range 64 {
		loads[fmt.Sprintf("vllm-qwen3-8b-7c9f8d6b5-%05d", i)] = scoring.Load{PrefillTokens: 12000, ActiveBlocks: 900, ActiveRequests: 40, PendingRequests: 6}
	}
	return loads
}

// BenchmarkReportOf64BusyWorkers is one report's CPU on both sides, without the
// network: written for 64 busy workers, as a watch stream sends it, then parsed.
func BenchmarkReportOf64BusyWorkers(b *testing.B) {
	loads := busyWorkers64()
	replica := NewReplicaID()
	b.ReportAllocs()
	for b.Loop() {
		line := reportLine(replica, loads, nil)
		b.SetBytes(int64(len(line)))
		if _, err := parseReport(line); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReportOf64BusyWorkersWithHistories is BenchmarkReportOf64BusyWorkers with
// a prefill history on every worker (prefill_history_weight's H, sent whatever ω).
func BenchmarkReportOf64BusyWorkersWithHistories(b *testing.B) {
	loads := busyWorkers64()
	histories := map[string]scoring.History{}
	for name := range loads {
		histories[name] = scoring.History{Tokens: 123456, Age: 12345 * time.Millisecond, HalfLife: 30}
	}
	replica := NewReplicaID()
	b.ReportAllocs()
	for b.Loop() {
		line, _ := reportOf(replica, loads, nil, histories)
		b.SetBytes(int64(len(line)))
		if _, err := parseReport(line); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseReportOf64BusyWorkers is the reading side alone, what each report from
// a watched peer costs before it is summed in.
func BenchmarkParseReportOf64BusyWorkers(b *testing.B) {
	line := reportLine(NewReplicaID(), busyWorkers64(), nil)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseReport(line); err != nil {
			b.Fatal(err)
		}
	}
}

// countingBookings counts how often its loads are read, to tell encodings apart.
type countingBookings struct {
	*fakeBookings
	mu    sync.Mutex
	reads int
}

func (c *countingBookings) LoadsWithAdapters() (map[string]scoring.Load, map[string]map[string]int) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.fakeBookings.LoadsWithAdapters()
}

func (c *countingBookings) count() int { c.mu.Lock(); defer c.mu.Unlock(); return c.reads }

// watchLines opens a watch stream of the server at url and returns its lines.
func watchLines(t *testing.T, url string) *bufio.Scanner {
	t.Helper()
	return watchLinesAt(t, url+Path+"?watch")
}

// watchLinesAt opens a watch stream at url and returns its lines.
func watchLinesAt(t *testing.T, url string) *bufio.Scanner {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, MaxReportBytes+1)
	return lines
}

// TestWatchersShareOneEncodingPerVersion: however many watch, each version of the
// ledger is read and encoded once, and every stream gets it.
func TestWatchersShareOneEncodingPerVersion(t *testing.T) {
	ledger := &countingBookings{fakeBookings: newFakeBookings(map[string]scoring.Load{"w": {ActiveRequests: 1}})}
	opts := testHandlerOptions(nil)
	opts.MaxWatchers, opts.Heartbeat = 8, time.Hour
	srv := httptest.NewServer(Handler("r1", ledger, opts))
	defer stopServer(srv)
	var streams []*bufio.Scanner
	for range 5 {
		streams = append(streams, watchLines(t, srv.URL))
	}
	for _, s := range streams {
		require.True(t, s.Scan())
	}
	ledger.set(map[string]scoring.Load{"w": {ActiveRequests: 3}})
	for i, s := range streams {
		require.True(t, s.Scan(), "stream %d", i)
		r, err := parseReport(s.Bytes())
		require.NoError(t, err)
		assert.Equal(t, []WorkerLoad{{Worker: "w", ActiveRequests: 3}}, r.Workers, "stream %d has the change", i)
	}
	assert.Equal(t, 2, ledger.count(), "two versions, each read once for five streams")
}

// TestWatchEndsWhenTheWatcherStopsReading: a watcher that stops reading (a hung peer,
// its socket buffers full) loses its stream after WriteTimeout, and its slot goes to
// the next watcher; without the bound it would hold the slot for ever.
func TestWatchEndsWhenTheWatcherStopsReading(t *testing.T) {
	// Large reports, changing all the time, fill the socket buffers fast.
	big := func(n int) map[string]scoring.Load {
		loads := map[string]scoring.Load{}
		for i := range MaxReportWorkers {
			loads[fmt.Sprintf("vllm-qwen3-8b-7c9f8d6b5-%05d", i)] = scoring.Load{ActiveRequests: n}
		}
		return loads
	}
	ledger := newFakeBookings(big(1))
	opts := testHandlerOptions(nil)
	opts.MaxWatchers, opts.WriteTimeout = 1, 50*time.Millisecond
	srv := httptest.NewServer(Handler("r1", ledger, opts))
	defer stopServer(srv)
	stopChanging := make(chan struct{})
	changed := make(chan struct{})
	go func() {
		defer close(changed)
		for n := 2; ; n++ {
			select {
			case <-stopChanging:
				return
			case <-time.After(time.Millisecond):
				ledger.set(big(n))
			}
		}
	}()
	defer func() { close(stopChanging); <-changed }()

	frozen, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer frozen.Close()
	require.NoError(t, frozen.(*net.TCPConn).SetReadBuffer(4096))
	_, err = fmt.Fprintf(frozen, "GET %s?watch HTTP/1.1\r\nHost: peer\r\n\r\n", Path)
	require.NoError(t, err)
	// It reads its status line, then nothing more.
	status, err := bufio.NewReader(frozen).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, status, "200")

	require.Eventually(t, func() bool {
		resp, err := http.Get(srv.URL + Path + "?watch")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond, "the frozen watcher's slot is freed")
}

// TestWatchSendsTheLastChangeAtShutdown: a change made just before the server shuts
// down reaches the watcher before its stream ends.
func TestWatchSendsTheLastChangeAtShutdown(t *testing.T) {
	ledger := newFakeBookings(map[string]scoring.Load{"w": {ActiveRequests: 1}})
	done := make(chan struct{})
	opts := testHandlerOptions(done)
	opts.Interval, opts.Heartbeat = time.Hour, time.Hour // only shutdown can send it
	srv := httptest.NewServer(Handler("r1", ledger, opts))
	defer stopServer(srv)
	lines := watchLines(t, srv.URL)
	require.True(t, lines.Scan())
	ledger.set(map[string]scoring.Load{})
	close(done)
	require.True(t, lines.Scan(), "a report after the change")
	r, err := parseReport(lines.Bytes())
	require.NoError(t, err)
	assert.Empty(t, r.Workers, "the release made while shutting down")
	assert.False(t, lines.Scan(), "then the end")
}

// BenchmarkOneChangeFor64Watchers is what one change costs a replica watched by 64
// peers, without the network: the ledger read and encoded once, and 64 streams woken to
// send it (to io.Discard).
func BenchmarkOneChangeFor64Watchers(b *testing.B) {
	ledger := newFakeBookings(busyWorkers64())
	pub := &publisher{replica: NewReplicaID(), ledger: ledger, interval: time.Hour}
	var sent sync.WaitGroup
	stop := make(chan struct{})
	var watchers sync.WaitGroup
	for range 64 {
		first := pub.join()
		watchers.Go(func() {
			defer pub.leave()
			for e := first; ; {
				select {
				case <-stop:
					return
				case <-e.next:
					e = pub.latest()
					_, _ = io.Discard.Write(e.plain)
					sent.Done()
				}
			}
		})
	}
	b.ReportAllocs()
	for b.Loop() {
		sent.Add(64)
		ledger.mu.Lock()
		ledger.version++
		ledger.mu.Unlock()
		pub.current()
		sent.Wait()
	}
	close(stop)
	watchers.Wait()
}

// TestHandlerWithATokenServesOnlyRequestsBearingIt: with a token, a report or a watch
// stream goes only to a request whose Authorization bears it; the others get 401 and
// the scheme to use. Without a token, anyone who reaches the port reads it.
func TestHandlerWithATokenServesOnlyRequestsBearingIt(t *testing.T) {
	const secret = "0123456789abcdef-peers"
	ledger := newFakeBookings(map[string]scoring.Load{"worker-7": {ActiveRequests: 1}})
	tests := []struct {
		name, token, authorization string
		want                       int
	}{
		{"no token configured, none sent", "", "", http.StatusOK},
		{"the right token", secret, "Bearer " + secret, http.StatusOK},
		{"no Authorization", secret, "", http.StatusUnauthorized},
		{"another token", secret, "Bearer 0123456789abcdef-peerz", http.StatusUnauthorized},
		{"a prefix of the token", secret, "Bearer 0123456789abcdef", http.StatusUnauthorized},
		{"another scheme", secret, "Basic " + secret, http.StatusUnauthorized},
		{"the scheme in lower case", secret, "bearer " + secret, http.StatusOK},
	}
	for _, tt := range tests {
		for _, query := range []string{"", "?watch"} {
			t.Run(tt.name+query, func(t *testing.T) {
				done := make(chan struct{})
				close(done) // a watch stream sends its first report and ends
				opts := testHandlerOptions(done)
				opts.Token = tt.token
				req := httptest.NewRequest(http.MethodGet, Path+query, nil)
				if tt.authorization != "" {
					req.Header.Set("Authorization", tt.authorization)
				}
				rec := httptest.NewRecorder()
				Handler("r1", ledger, opts).ServeHTTP(rec, req)
				require.Equal(t, tt.want, rec.Code)
				if tt.want == http.StatusUnauthorized {
					assert.Equal(t, `Bearer realm="kvroute-peers"`, rec.Header().Get("WWW-Authenticate"))
					assert.NotContains(t, rec.Body.String(), "worker-7", "no load in the refusal")
					return
				}
				_, err := parseReport([]byte(strings.SplitN(rec.Body.String(), "\n", 2)[0]))
				assert.NoError(t, err)
			})
		}
	}
}

// TestWatchStreamEndsCleanlyAtItsMaxAge: a watch stream ends after MaxStreamAge with a
// clean end of the response, after at least its first report.
func TestWatchStreamEndsCleanlyAtItsMaxAge(t *testing.T) {
	ledger := newFakeBookings(map[string]scoring.Load{"w": {ActiveRequests: 1}})
	opts := testHandlerOptions(nil)
	opts.MaxStreamAge = 20 * time.Millisecond
	srv := httptest.NewServer(Handler("r1", ledger, opts))
	defer stopServer(srv)
	lines := watchLines(t, srv.URL)
	reports := 0
	for lines.Scan() {
		_, err := parseReport(lines.Bytes())
		require.NoError(t, err)
		reports++
		// A stream that outlived its age would send a heartbeat every 250 ms for ever:
		// fail after waitFor of them rather than hang until the test binary's timeout.
		require.Less(t, reports, int(waitFor/Heartbeat), "the stream outlived MaxStreamAge")
	}
	assert.NoError(t, lines.Err(), "a clean end")
	assert.Positive(t, reports)
}

// A worker's resident LoRA adapters go in the report with their requests, also for a
// worker with nothing booked now (an adapter resident between its requests), and parse
// back as written.
func TestReportCarriesResidentAdapters(t *testing.T) {
	line := reportLine("r1", map[string]scoring.Load{"busy": {ActiveRequests: 3}, "idle": {}, "quiet": {}},
		map[string]map[string]int{"busy": {"sql": 2, "chat": 1}, "quiet": {"sql": 0}})
	r, err := parseReport(line)
	require.NoError(t, err)
	assert.Equal(t, []WorkerLoad{
		{Worker: "busy", ActiveRequests: 3, Adapters: map[string]int64{"sql": 2, "chat": 1}},
		{Worker: "quiet", Adapters: map[string]int64{"sql": 0}},
	}, r.Workers)
}

// TestReportsStayConsistentWhileAdaptersAreBooked: a replica's report is one snapshot of
// its ledger, so what a peer reads of an adapter's requests never exceeds the worker's
// (a peer refuses such a report whole), however bookings come and go while it is
// written.
func TestReportsStayConsistentWhileAdaptersAreBooked(t *testing.T) {
	ledger := scoring.NewBookingsResident(time.Minute, nil)
	srv := httptest.NewServer(Handler("r1", ledger, testHandlerOptions(nil)))
	defer srv.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ledger.BookAdapter("w", "sql", nil, 0).Release()
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	for i := range 2000 {
		res, err := http.Get(srv.URL + Path)
		require.NoError(t, err)
		_, err = ParseReport(res.Body)
		res.Body.Close()
		require.NoError(t, err, "report %d", i)
	}
}

// TestReportKeepsWithinWhatPeersAccept: a worker with more resident adapters than a
// peer takes (a fleet of many LoRA adapters within lora_residency), or one whose name
// is longer than a peer takes (an engine's model list allows 512 bytes), must not make
// the whole report one the peers refuse: they would drop the stream at every report and
// count none of this replica's load. The report keeps the adapters with the most
// requests, up to the bound, and leaves out names no peer accepts.
func TestReportKeepsWithinWhatPeersAccept(t *testing.T) {
	resident := map[string]int{strings.Repeat("x", MaxAdapterName+1): 3}
	for i := range MaxWorkerAdapters + 50 {
		resident[fmt.Sprintf("a%03d", i)] = 0
	}
	resident["busy"] = 2
	ledger := newFakeBookings(map[string]scoring.Load{"w": {ActiveRequests: 5, PendingRequests: 1, PrefillTokens: 10}})
	ledger.setAdapters(map[string]map[string]int{"w": resident})
	rec := httptest.NewRecorder()
	Handler("r1", ledger, testHandlerOptions(nil)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	r, err := ParseReport(rec.Body)
	require.NoError(t, err, "a peer accepts what a replica writes")
	require.Len(t, r.Workers, 1)
	w := r.Workers[0]
	assert.Equal(t, WorkerLoad{Worker: "w", ActiveRequests: 5, PendingRequests: 1, PrefillTokens: 10}, WorkerLoad{Worker: w.Worker,
		ActiveRequests: w.ActiveRequests, PendingRequests: w.PendingRequests, PrefillTokens: w.PrefillTokens}, "the load is whole")
	assert.Len(t, w.Adapters, MaxWorkerAdapters)
	assert.Equal(t, int64(2), w.Adapters["busy"], "the adapters with requests are kept first")
	assert.Contains(t, w.Adapters, "a000", "then by name")
	assert.NotContains(t, w.Adapters, fmt.Sprintf("a%03d", MaxWorkerAdapters+49))
}
