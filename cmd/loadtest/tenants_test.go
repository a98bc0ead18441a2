package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseTenants(t *testing.T) {
	tests := []struct {
		in   string
		want []tenant
		err  string
	}{
		{"", nil, ""},
		{"a:15,b:1", []tenant{{"a", 15}, {"b", 1}}, ""},
		{"noisy:3, quiet:1", []tenant{{"noisy", 3}, {"quiet", 1}}, ""},
		{"team-a/prod:2", []tenant{{"team-a/prod", 2}}, ""},
		{"a", nil, `"a" is not name:streams`},
		{"a:0", nil, "a's streams must be a whole number ≥ 1"},
		{"a:-1", nil, "a's streams must be a whole number ≥ 1"},
		{"a:x", nil, `got "x"`},
		{":2", nil, `"" cannot be a fairness id`},
		{"a b:2", nil, `"a b" cannot be a fairness id`},
		{"a:1:2", nil, `got "1:2"`},
		{"a:1,a:2", nil, `"a" given twice`},
		{"a:1,", nil, `"" is not name:streams`},
		{strings.Repeat("x", 254) + ":1", nil, "cannot be a fairness id"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseTenants(tt.in)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestTenantsAreBoundedInNumber(t *testing.T) {
	pairs := make([]string, maxTenants+1)
	for i := range pairs {
		pairs[i] = fmt.Sprintf("t%d:1", i)
	}
	_, err := parseTenants(strings.Join(pairs[:maxTenants], ","))
	require.NoError(t, err)
	_, err = parseTenants(strings.Join(pairs, ","))
	assert.ErrorContains(t, err, fmt.Sprintf("at most %d tenants", maxTenants))
}

func TestTenantsFlagsAreValidated(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"-streams beside -tenants", []string{"-tenants", "a:2", "-streams", "2"}, "-streams and -tenants: give one"},
		{"a bad tenant", []string{"-tenants", "a:none"}, "-tenants: a's streams must be a whole number"},
		{"over 20000 streams", []string{"-tenants", "a:20000,b:1"}, "-streams: must be 1-20000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			assert.Equal(t, 2, cli(tt.args, &stdout, &stderr))
			assert.Contains(t, stderr.String(), tt.want)
		})
	}
	requireValidation(t, []optionsCase{
		{"the tenants' streams are -streams", func(o *options) { o.load.tenants, o.streams = []tenant{{"a", 15}, {"b", 1}}, 16 }, ""},
		{"the tenants' streams are not -streams", func(o *options) { o.load.tenants, o.streams = []tenant{{"a", 15}, {"b", 1}}, 200 }, "-tenants: their 16 streams"},
	})
}

func TestStreamsAreTheTenantsInTheFlagsOrder(t *testing.T) {
	tests := []struct {
		name    string
		tenants []tenant
		want    []string
	}{
		{"none", nil, nil},
		{"a noisy tenant first", []tenant{{"a", 3}, {"b", 1}}, []string{"a", "a", "a", "b"}},
		{"three", []tenant{{"x", 1}, {"y", 2}, {"z", 1}}, []string{"x", "y", "y", "z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, groupKeys(tt.tenants))
			assert.Equal(t, len(tt.want), groupStreams(tt.tenants))
		})
	}
}

func TestTenantReportsAggregateEachTenantApart(t *testing.T) {
	type request struct {
		tenant      string
		ttft, total time.Duration
		class       string // "" served; else the failure's class
		rateLimited int    // 429s before it
	}
	tests := []struct {
		name     string
		requests []request
		secs     float64
		want     map[string]tenantReport // Streams, Requests, RateLimited, SDKGaveUp, Errors; latencies checked apart
		p50      map[string]time.Duration
	}{
		{"nothing measured", nil, 10, map[string]tenantReport{
			"a": {Streams: 2, Errors: map[string]int64{}}, "b": {Streams: 1, Errors: map[string]int64{}}}, map[string]time.Duration{"a": 0, "b": 0}},
		{"each tenant's own requests", []request{
			{"a", 10 * time.Millisecond, 100 * time.Millisecond, "", 0},
			{"a", 30 * time.Millisecond, 300 * time.Millisecond, "", 1},
			{"a", 20 * time.Millisecond, 200 * time.Millisecond, "", 3},
			{"b", 5 * time.Millisecond, 50 * time.Millisecond, "", 0},
			{"b", 0, 0, "status 504", 0},
		}, 2, map[string]tenantReport{
			"a": {Streams: 2, Requests: 3, RequestsPerSec: 1.5, RateLimited: 4, SDKGaveUp: 1, Errors: map[string]int64{}},
			"b": {Streams: 1, Requests: 1, RequestsPerSec: 0.5, Errors: map[string]int64{"status 504": 1}},
		}, map[string]time.Duration{"a": 20 * time.Millisecond, "b": 5 * time.Millisecond}},
	}
	tenants := []tenant{{"a", 2}, {"b", 1}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := defaultOptions().load
			w.tenants = tenants
			g := newGenerator(w, 3)
			m := g.cur.Load()
			for _, r := range tt.requests {
				tm := m.tenants[r.tenant]
				for i := range r.rateLimited {
					tm.rateLimited.Add(1)
					if i == sdkMaxRetries {
						tm.sdkGaveUp.Add(1)
					}
				}
				if r.class != "" {
					tm.fail(r.class)
					continue
				}
				tm.completed.Add(1)
				tm.ttft.observe(r.ttft)
				tm.latency.observe(r.total)
			}
			got := tenantReports(tenants, m, tt.secs)
			require.Len(t, got, len(tt.want))
			for name, want := range tt.want {
				g := got[name]
				assert.InDelta(t, want.RequestsPerSec, g.RequestsPerSec, 1e-9, name)
				assert.Equal(t, want.Requests, g.TTFT.Count, "%s: a TTFT per request served", name)
				assert.Equal(t, want.Requests, g.Latency.Count, "%s: a latency per request served", name)
				assert.InDelta(t, float64(tt.p50[name]), float64(g.TTFT.P50), float64(tt.p50[name])*(histGrowth-1), "%s's TTFT p50, within a bucket", name)
				assert.GreaterOrEqual(t, g.Latency.P99, g.Latency.P50, name)
				g.RequestsPerSec, g.TTFT, g.Latency = want.RequestsPerSec, latency{}, latency{}
				assert.Equal(t, want, g, name)
			}
		})
	}
}

func TestRetryAfterReadsTheServersDelay(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header map[string]string
		want   time.Duration
		ok     bool
	}{
		{"none", nil, 0, false},
		{"kvroute's: whole seconds", map[string]string{"retry-after": "1"}, time.Second, true},
		{"fractional seconds", map[string]string{"retry-after": "0.25"}, 250 * time.Millisecond, true},
		{"milliseconds first", map[string]string{"retry-after-ms": "40", "retry-after": "3"}, 40 * time.Millisecond, true},
		{"bad milliseconds fall back to seconds", map[string]string{"retry-after-ms": "soon", "retry-after": "3"}, 3 * time.Second, true},
		{"an HTTP date", map[string]string{"retry-after": now.Add(5 * time.Second).Format(http.TimeFormat)}, 5 * time.Second, true},
		{"a date passed", map[string]string{"retry-after": now.Add(-time.Minute).Format(http.TimeFormat)}, 0, true},
		{"over two minutes", map[string]string{"retry-after": "121"}, 0, false},
		{"negative", map[string]string{"retry-after": "-1"}, 0, false},
		{"garbage", map[string]string{"retry-after": "later"}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.header {
				h.Set(k, v)
			}
			got, ok := retryAfter(h, now)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestBackoffDoublesUpToEightSecondsLessJitter(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tests := []struct {
		retry    int
		nominal  time.Duration
		minDelay time.Duration
	}{
		{0, 500 * time.Millisecond, 375 * time.Millisecond},
		{1, time.Second, 750 * time.Millisecond},
		{3, 4 * time.Second, 3 * time.Second},
		{4, 8 * time.Second, 6 * time.Second},
		{40, 8 * time.Second, 6 * time.Second},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.retry), func(t *testing.T) {
			for range 100 {
				d := backoff(tt.retry, rng)
				assert.LessOrEqual(t, d, tt.nominal)
				assert.GreaterOrEqual(t, d, tt.minDelay)
			}
		})
	}
}

// rateLimiter is a loopback upstream that refuses each tenant's first refusals
// requests with a 429 (retry-after-ms 1), then streams a one-token chat answer; it
// records the fairness header of every request.
type rateLimiter struct {
	mu       sync.Mutex
	refusals int
	refused  map[string]int
	seen     []string
}

func (rl *rateLimiter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := r.Header.Get("x-llm-d-inference-fairness-id")
	rl.mu.Lock()
	rl.seen = append(rl.seen, tenant)
	refuse := rl.refused[tenant] < rl.refusals
	if refuse {
		rl.refused[tenant]++
	}
	rl.mu.Unlock()
	if refuse {
		w.Header().Set("retry-after-ms", "1")
		w.Header().Set("retry-after", "1")
		http.Error(w, `{"error":{"code":"rate_limit_exceeded"}}`, http.StatusTooManyRequests)
		return
	}
	w.Header().Set("x-served-by", "w0")
	fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\" hi\"}}]}\n\n")
	fmt.Fprint(w, "data: {\"usage\":{\"prompt_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n")
}

// TestATenantsStreamRetriesEach429: with tenants a 429 is counted and the same turn
// resent after its retry-after (here retry-after-ms: 1), timed from its first attempt;
// without tenants a 429 is an error, as it always was. One loopback server, a handful
// of requests.
func TestATenantsStreamRetriesEach429(t *testing.T) {
	tests := []struct {
		name       string
		tenants    []tenant
		refusals   int
		wantErr    string
		wantCalls  int
		wantRL     int64
		wantGaveUp int64
	}{
		{"no tenants: a 429 fails the request", nil, 1, "429", 1, 0, 0},
		{"a tenant: retried once", []tenant{{"a", 1}}, 1, "", 2, 1, 0},
		{"a tenant: past the SDK's two retries", []tenant{{"a", 1}}, 4, "", 5, 4, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rl := &rateLimiter{refusals: tt.refusals, refused: map[string]int{}}
			srv := httptest.NewServer(rl)
			defer srv.Close()
			w := defaultOptions().load
			w.tenants, w.fairnessHeader, w.requestTimeout = tt.tenants, "x-llm-d-inference-fairness-id", 10*time.Second
			g := newGenerator(w, 1)
			g.urls = []string{srv.URL}
			var st *streamTenant
			if tt.tenants != nil {
				st = &streamTenant{name: g.tenantOf[0], rng: rand.New(rand.NewPCG(1, 1))}
			}
			ctx := context.Background()
			res, err := g.turn(ctx, ctx, srv.URL, st, 1, []byte(`{}`))
			rl.mu.Lock()
			defer rl.mu.Unlock()
			assert.Len(t, rl.seen, tt.wantCalls, "requests sent")
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				assert.Equal(t, "status 429", res.class)
				assert.Equal(t, []string{""}, rl.seen, "no fairness header without tenants")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "w0", res.servedBy)
			for _, s := range rl.seen {
				assert.Equal(t, "a", s, "every attempt names the tenant")
			}
			tm := g.cur.Load().tenants["a"]
			assert.Equal(t, tt.wantRL, tm.rateLimited.Load())
			assert.Equal(t, tt.wantRL, g.rateLimited.Load())
			assert.Equal(t, tt.wantGaveUp, tm.sdkGaveUp.Load())
			assert.Equal(t, int64(1), tm.ttft.count(), "one TTFT for the turn, not one per attempt")
			assert.GreaterOrEqual(t, tm.latency.max(), time.Duration(tt.wantRL)*time.Millisecond, "timed from the first attempt, retry waits included")
		})
	}
}

// TestATurnWaitingToRetryEndsWithTheLoad: a 429 asking for a minute's wait ends the
// turn as soon as the load ends, not as an error.
func TestATurnWaitingToRetryEndsWithTheLoad(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("retry-after", "60")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	w := defaultOptions().load
	w.tenants, w.fairnessHeader = []tenant{{"a", 1}}, "x-llm-d-inference-fairness-id"
	g := newGenerator(w, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for g.rateLimited.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	_, err := g.turn(ctx, context.Background(), srv.URL, &streamTenant{name: "a", rng: rand.New(rand.NewPCG(1, 1))}, 1, []byte(`{}`))
	assert.ErrorIs(t, err, errLoadEnded)
	assert.Equal(t, int64(1), g.cur.Load().tenants["a"].rateLimited.Load())
}
