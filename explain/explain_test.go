package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http/httpguts"

	"github.com/kvroute/kvroute/internal/fakeclock"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// decision builds a routed decision over n candidates named name(i); candidate i costs
// i blocks, so the best is 0, and the picker chose chosen.
func decision(n, chosen int, name func(i int) string) *router.Decision {
	d := &router.Decision{PromptTokens: 640, Blocks: 10, PredictedCachedTokens: 128}
	for i := range n {
		d.Terms = append(d.Terms, scoring.Terms{
			Candidate: scoring.Candidate{Worker: name(i), Overlap: 2, ActiveBlocks: i, SessionWorker: i == chosen},
			Prefill:   0.5, Session: -1, Cost: float64(i),
		})
	}
	d.Chosen, d.Worker, d.Address = chosen, name(chosen), fmt.Sprintf("10.0.0.%d:8000", chosen)
	for i := range n {
		if i != chosen {
			d.Fallbacks = append(d.Fallbacks, i)
			d.FallbackAddresses = append(d.FallbackAddresses, fmt.Sprintf("10.0.0.%d:8000", i))
		}
	}
	return d
}

func plain(i int) string { return fmt.Sprint("w", i) }

func TestTraceListsTheChosenThenTheFallbacks(t *testing.T) {
	d := decision(4, 2, plain)
	tr := Of(d, 0)
	var workers, addresses []string
	for _, c := range tr.Candidates {
		workers, addresses = append(workers, c.Worker), append(addresses, c.Address)
	}
	assert.Equal(t, []string{"w2", "w0", "w1", "w3"}, workers)
	assert.Equal(t, []string{"10.0.0.2:8000", "10.0.0.0:8000", "10.0.0.1:8000", "10.0.0.3:8000"}, addresses)
	assert.Equal(t, "w2", tr.Worker)
	assert.Zero(t, tr.Omitted)
	assert.True(t, tr.Candidates[0].SessionWorker)
	assert.Equal(t, -1.0, tr.Candidates[0].Session, "every term is carried")

	limited := Of(d, 2)
	assert.Len(t, limited.Candidates, 2)
	assert.Equal(t, 2, limited.Omitted)
}

// The trace names the request's objective and its priority when it named one, priority
// 0 included (an objective no source defines), and says nothing of either otherwise.
func TestTraceNamesTheObjectiveAndItsPriority(t *testing.T) {
	tests := []struct {
		name      string
		objective string
		priority  int
		want      string // the JSON fields; "" none
	}{
		{"no objective", "", 0, ""},
		{"a sheddable objective", "batch", -1, `"objective":"batch","priority":-1`},
		{"an objective no source defines", "nightly", 0, `"objective":"nightly","priority":0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decision(2, 0, plain)
			d.Objective, d.Priority = tt.objective, tt.priority
			raw, err := HeaderValue(d)
			require.NoError(t, err)
			if tt.want == "" {
				assert.NotContains(t, string(raw), `"objective"`)
				assert.NotContains(t, string(raw), `"priority"`)
				return
			}
			assert.Contains(t, string(raw), tt.want)
		})
	}
}

func TestHeaderValueIsBoundedJSON(t *testing.T) {
	long := func(i int) string { return fmt.Sprintf("%s-%d", strings.Repeat("worker-name-", 20), i) }
	tests := []struct {
		name           string
		d              *router.Decision
		wantCandidates int
		wantOmitted    int
	}{
		{"two candidates: all shown", decision(2, 1, plain), 2, 0},
		{"a hundred candidates: the best eight", decision(100, 0, plain), 8, 92},
		{"long names: fewer, to fit 4 KiB", decision(100, 0, long), 5, 95},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := HeaderValue(tt.d)
			require.NoError(t, err)
			assert.LessOrEqual(t, len(raw), MaxHeaderBytes)
			var tr Trace
			require.NoError(t, json.Unmarshal(raw, &tr))
			assert.Len(t, tr.Candidates, tt.wantCandidates)
			assert.Equal(t, tt.wantOmitted, tr.Omitted)
			assert.Equal(t, tt.d.Worker, tr.Candidates[0].Worker, "the chosen worker comes first")
		})
	}
}

func TestHeaderValueIsASCII(t *testing.T) {
	d := decision(2, 0, func(i int) string { return fmt.Sprint("wörker-😀-", i) })
	raw, err := HeaderValue(d)
	require.NoError(t, err)
	for _, b := range raw {
		require.Less(t, b, byte(0x80), "%s", raw)
	}
	var tr Trace
	require.NoError(t, json.Unmarshal(raw, &tr))
	assert.Equal(t, "wörker-😀-0", tr.Worker, "escaped, not altered")
}

// The model and adapter names are the client's, and JSON leaves DEL (0x7f) as it is:
// a header value may not carry it (RFC 9110 field-vchar), and a client's HTTP library
// (h11, Go's) refuses the whole response over it. Every byte must be a valid value byte.
func TestHeaderValueIsAValidHeaderValue(t *testing.T) {
	for _, tc := range []struct{ name, model, lora string }{
		{"DEL in the model", "m\x7fodel", ""},
		{"DEL in the adapter", "model", "lo\x7fra"},
		{"control characters", "m\x00\x1f\t", "\r\n"},
		{"non-ASCII", "mödel-😀", "lörä"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decision(2, 0, plain)
			d.Model, d.LoRA = tc.model, tc.lora
			raw, err := HeaderValue(d)
			require.NoError(t, err)
			assert.True(t, httpguts.ValidHeaderFieldValue(string(raw)), "%q", raw)
			var tr Trace
			require.NoError(t, json.Unmarshal(raw, &tr))
			assert.Equal(t, tc.model, tr.Model, "escaped, not altered")
			assert.Equal(t, tc.lora, tr.LoRA, "escaped, not altered")
		})
	}
}

func TestHeaderValueRefusesRatherThanOverflow(t *testing.T) {
	_, err := HeaderValue(decision(1, 0, func(int) string { return strings.Repeat("x", MaxHeaderBytes) }))
	assert.ErrorContains(t, err, "over 4096")
}

func newRecorder(t *testing.T, cfg Config) (*Recorder, *fakeclock.Clock) {
	t.Helper()
	clock := fakeclock.New(time.Unix(1_700_000_000, 0).UTC())
	r, err := New(cfg, clock.Now)
	require.NoError(t, err)
	return r, clock
}

func TestWantsOnlyWhenEnabled(t *testing.T) {
	on, _ := newRecorder(t, Config{Enabled: true, Header: "X-Kvroute-Explain", SampleRate: 0, Buffer: 1})
	off, _ := newRecorder(t, Config{Enabled: false, Header: "x-kvroute-explain", SampleRate: 0, Buffer: 1})
	assert.Equal(t, "x-kvroute-explain", on.Header(), "lower case, as Envoy sends headers")
	for _, tt := range []struct {
		value string
		want  bool
	}{{"1", true}, {"true", true}, {" 1 ", true}, {"0", false}, {"", false}, {"yes please", false}} {
		assert.Equal(t, tt.want, on.Wants(tt.value), "enabled, %q", tt.value)
		assert.False(t, off.Wants(tt.value), "disabled, %q", tt.value)
	}
}

func TestSampleKeepsOneDecisionInOneOverTheRate(t *testing.T) {
	tests := []struct {
		rate float64
		n    int
		want int
	}{{0, 1000, 0}, {0.01, 1000, 10}, {0.25, 100, 25}, {1, 7, 7}}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.rate), func(t *testing.T) {
			r, _ := newRecorder(t, Config{Header: "x-e", SampleRate: tt.rate, Buffer: 1000})
			for range tt.n {
				r.Observe(decision(2, 0, plain))
			}
			assert.Len(t, r.Recent(1000), tt.want)
		})
	}
}

func TestRingKeepsTheNewestBufferEntries(t *testing.T) {
	r, clock := newRecorder(t, Config{Header: "x-e", SampleRate: 1, Buffer: 3})
	for i := range 5 {
		r.Observe(decision(2, i%2, plain))
		clock.Advance(time.Second)
	}
	got := r.Recent(10)
	require.Len(t, got, 3, "bounded by buffer")
	var seconds []int64
	for _, e := range got {
		seconds = append(seconds, e.Time.Unix()-1_700_000_000)
	}
	assert.Equal(t, []int64{4, 3, 2}, seconds, "newest first")
	assert.Len(t, r.Recent(2), 2)
}

func TestDecisionsEndpoint(t *testing.T) {
	r, _ := newRecorder(t, Config{Header: "x-e", SampleRate: 1, Buffer: 4})
	for range 6 {
		r.Observe(decision(10, 0, plain))
	}
	tests := []struct {
		name   string
		query  string
		status int
		want   int
	}{
		{"every kept decision", "", http.StatusOK, 4},
		{"limit", "?limit=2", http.StatusOK, 2},
		{"limit over the buffer", "?limit=100", http.StatusOK, 4},
		{"zero", "?limit=0", http.StatusBadRequest, 0},
		{"not a number", "?limit=all", http.StatusBadRequest, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/decisions"+tt.query, nil))
			require.Equal(t, tt.status, rec.Code, rec.Body.String())
			assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			if tt.status != http.StatusOK {
				assert.Contains(t, rec.Body.String(), `"error":"limit:`)
				return
			}
			var body Decisions
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
			assert.Len(t, body.Decisions, tt.want)
			assert.Equal(t, 1.0, body.SampleRate)
			assert.Len(t, body.Decisions[0].Candidates, MaxCandidates, "the ring keeps the best eight")
			assert.Equal(t, 2, body.Decisions[0].Omitted)
		})
	}
}

func TestConcurrentObserveAndRead(t *testing.T) {
	r, _ := newRecorder(t, Config{Header: "x-e", SampleRate: 0.5, Buffer: 16})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				r.Observe(decision(3, 1, plain))
				_ = r.Recent(8)
			}
		})
	}
	wg.Wait()
	assert.Len(t, r.Recent(100), 16)
}

func TestConfigValidateNamesTheKey(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"default", func(*Config) {}, ""},
		{"empty header", func(c *Config) { c.Header = "" }, "explain.header"},
		{"x-envoy header", func(c *Config) { c.Header = "x-envoy-explain" }, "explain.header"},
		{"not a header token", func(c *Config) { c.Header = "x(why)" }, "explain.header"},
		{"negative rate", func(c *Config) { c.SampleRate = -0.1 }, "explain.sample_rate"},
		{"rate over 1", func(c *Config) { c.SampleRate = 1.5 }, "explain.sample_rate"},
		{"zero buffer", func(c *Config) { c.Buffer = 0 }, "explain.buffer"},
		{"huge buffer", func(c *Config) { c.Buffer = MaxBuffer + 1 }, "explain.buffer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			err := c.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// A candidate's trace lists at most MaxEngineAdapters of its engine's adapters, and
// counts the rest: an engine may name thousands.
func TestTraceBoundsTheEnginesAdapters(t *testing.T) {
	names := make([]string, MaxEngineAdapters+5)
	for i := range names {
		names[i] = fmt.Sprint("adapter-", i)
	}
	c := candidateOf(scoring.Terms{Candidate: scoring.Candidate{Worker: "w0", EngineAdapters: names}}, "10.0.0.1:8000", "")
	assert.Equal(t, names[:MaxEngineAdapters], c.EngineAdapters)
	assert.Equal(t, 5, c.EngineAdaptersOmitted)
	c = candidateOf(scoring.Terms{Candidate: scoring.Candidate{Worker: "w0", EngineAdapters: names[:2]}}, "10.0.0.1:8000", "")
	assert.Equal(t, names[:2], c.EngineAdapters)
	assert.Zero(t, c.EngineAdaptersOmitted)
}

// A sampled entry's size is what MaxBuffer's bound counts on: the worst is every kept
// candidate (8 destinations, 8 prefill workers) listing engine adapters with the
// longest names an engine's page may give (512 bytes). The names' bytes are bounded per
// candidate, and the ones left out are counted. The entry's JSON stands for its size
// (13.7 KiB here; before the bound, 16 such names on each candidate made ~140 KiB).
func TestASampledEntryStaysWithinMaxBuffersBound(t *testing.T) {
	long := make([]string, 32)
	for i := range long {
		long[i] = fmt.Sprintf("%03d", i) + strings.Repeat("a", 509)
	}
	d := decision(12, 0, plain)
	for i := range d.Terms {
		d.Terms[i].EngineAdapters = long
	}
	d.Prefill = &router.Prefill{Decision: scoring.Decision{Worker: "p0", Terms: slices.Clone(d.Terms)}, Address: "10.0.1.0:8000"}
	r, _ := newRecorder(t, Config{Header: "x-e", SampleRate: 1, Buffer: 4})
	r.Observe(d)
	entry := r.Recent(1)[0]
	raw, err := json.Marshal(entry)
	require.NoError(t, err)
	assert.Less(t, len(raw), 24<<10, "one sampled entry")
	assert.Less(t, len(raw)*MaxBuffer, 100<<20, "the ring at MaxBuffer")
	for _, c := range entry.Candidates {
		assert.Equal(t, long[:2], c.EngineAdapters, "%s: two 512-byte names fit in 1 KiB", c.Worker)
		assert.Equal(t, 30, c.EngineAdaptersOmitted, c.Worker)
	}
}

// The model and adapter a request names are the client's: with workers configured
// without models, any name routes. A trace keeps a bounded prefix of each, so a sampled
// entry stays small (MaxBuffer's bound) and the header still fits.
func TestTraceBoundsTheRequestsModelName(t *testing.T) {
	d := decision(3, 0, plain)
	d.Model, d.LoRA = strings.Repeat("m", 1<<20), strings.Repeat("é", 1<<19)
	r, _ := newRecorder(t, Config{Header: "x-e", SampleRate: 1, Buffer: 4})
	r.Observe(d)
	raw, err := json.Marshal(r.Recent(1))
	require.NoError(t, err)
	assert.Less(t, len(raw), 4096, "a sampled entry of a megabyte model name")
	tr := Of(d, 0)
	assert.True(t, strings.HasPrefix(d.Model, strings.TrimSuffix(tr.Model, "…")), "a prefix of the name")
	assert.True(t, utf8.ValidString(tr.LoRA), "cut between characters")

	header, err := HeaderValue(d)
	require.NoError(t, err, "the decision is answered whatever the model's name")
	assert.LessOrEqual(t, len(header), MaxHeaderBytes)
}

// A sampled entry keeps its own copy of the few adapters it lists: the engine's list
// (up to enginemetrics.MaxScrapedLoRAs names, cut from one label value of up to 2 MiB)
// is shared and replaced at every scrape, and an entry holding a slice of it, or names
// cut from it, would keep each scrape's whole list alive for as long as the ring does.
func TestSampledTraceDoesNotPinTheEnginesAdapterList(t *testing.T) {
	label := strings.Repeat("adapter-with-a-long-name,", 4096)
	names := strings.Split(strings.TrimSuffix(label, ","), ",")
	d := decision(3, 0, plain)
	for i := range d.Terms {
		d.Terms[i].EngineAdapters = names
	}
	r, _ := newRecorder(t, Config{Header: "x-e", SampleRate: 1, Buffer: 4})
	r.Observe(d)
	labelStart := uintptr(unsafe.Pointer(unsafe.StringData(label)))
	for _, c := range r.Recent(1)[0].Candidates {
		require.Len(t, c.EngineAdapters, MaxEngineAdapters)
		assert.LessOrEqual(t, cap(c.EngineAdapters), MaxEngineAdapters, "%s: the entry's list is its own", c.Worker)
		for _, name := range c.EngineAdapters {
			at := uintptr(unsafe.Pointer(unsafe.StringData(name)))
			assert.False(t, at >= labelStart && at < labelStart+uintptr(len(label)), "%s: %q is cut from the engine's label value", c.Worker, name)
		}
	}
}

// GET /decisions of a full ring at MaxBuffer is tens of MiB: it is written entry by
// entry, not encoded whole first, so that a read in progress (a slow client, or many at
// once) does not hold a copy of the ring's size: MaxBuffer bounds what the ring costs,
// not what each read of it costs. The bytes are what encoding it whole gives.
func TestDecisionsAreWrittenEntryByEntry(t *testing.T) {
	long := make([]string, 32)
	for i := range long {
		long[i] = fmt.Sprintf("%03d", i) + strings.Repeat("a", 509)
	}
	d := decision(12, 0, plain)
	for i := range d.Terms {
		d.Terms[i].EngineAdapters = long
	}
	r, _ := newRecorder(t, Config{Header: "x-e", SampleRate: 1, Buffer: MaxBuffer})
	for range MaxBuffer {
		r.Observe(d)
	}
	srv := httptest.NewServer(r)
	defer srv.Close()
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC() // twice: encoding/json keeps its buffers in a sync.Pool
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	// A client that reads a little of the answer, then stops: the handler blocks once
	// the socket buffers are full, holding what it has not written yet.
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	_, err = conn.Write([]byte("GET /decisions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
	require.NoError(t, err)
	_, err = io.ReadFull(conn, make([]byte, 1024))
	require.NoError(t, err)
	time.Sleep(500 * time.Millisecond)
	held := int64(heap()) - int64(before)
	want, err := json.Marshal(Decisions{SampleRate: 1, Buffer: MaxBuffer, Decisions: r.Recent(MaxBuffer)})
	require.NoError(t, err)
	t.Logf("answer %d MiB, held by the read in progress %d MiB", len(want)>>20, held>>20)
	assert.Less(t, held, int64(len(want)/8), "a read in progress holds a fraction of its answer")
	conn.Close()

	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/decisions", nil))
	assert.Equal(t, string(want)+"\n", rec.Body.String(), "the bytes of the whole encoded at once")
}
