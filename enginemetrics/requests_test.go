package enginemetrics

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRequests(t *testing.T) {
	const running, waiting = "vllm:num_requests_running", "vllm:num_requests_waiting"
	tests := []struct {
		name    string
		page    string
		want    int
		wantErr string
		bad     bool // wraps ErrBadValue
	}{
		{"running plus waiting", page("3", "0.5"), 8, "", false},
		{"summed over data-parallel ranks", "vllm:num_requests_running{engine=\"0\"} 2\nvllm:num_requests_running{engine=\"1\"} 3\nvllm:num_requests_waiting{engine=\"0\"} 1\nvllm:num_requests_waiting{engine=\"1\"} 0\n", 6, "", false},
		{"the rest of the page is not parsed", "garbage{{ line\nvllm:num_requests_running 1\nvllm:num_requests_waiting 0\n", 1, "", false},
		{"a metric name that only starts alike is another metric", "vllm:num_requests_running_total 9\nvllm:num_requests_running 1\nvllm:num_requests_waiting 0\n", 1, "", false},
		{"no running metric", "vllm:num_requests_waiting 1\n", 0, "no vllm:num_requests_running", false},
		{"no waiting metric", "vllm:num_requests_running 1\n", 0, "no vllm:num_requests_waiting", false},
		{"NaN", "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n", 0, "not a count", true},
		{"negative", "vllm:num_requests_running 1\nvllm:num_requests_waiting -1\n", 0, "not a count", true},
		{"beyond any engine", "vllm:num_requests_running 1e300\nvllm:num_requests_waiting 0\n", 0, "not a count", true},
		{"+Inf", "vllm:num_requests_running +Inf\nvllm:num_requests_waiting 0\n", 0, "not a count", true},
		{"a fraction is no count", "vllm:num_requests_running 1.5\nvllm:num_requests_waiting 0\n", 0, "not a count", true},
		{"a malformed sample line", "vllm:num_requests_running{engine= 1\nvllm:num_requests_waiting 0\n", 0, "parse", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequests([]byte(tt.page), running, waiting)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				assert.Equal(t, tt.bad, errorIsBadValue(err))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func errorIsBadValue(err error) bool { return errors.Is(err, ErrBadValue) }

// reports records the scraper's ReportRequests calls: the last per worker.
type reports struct {
	mu   sync.Mutex
	last map[string]int
}

func (r *reports) report(worker string, requests int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[worker] = requests
}

func (r *reports) get(worker string) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.last[worker]
	return n, ok
}

func TestScraperReportsEachEnginesRequests(t *testing.T) {
	var waiting atomic.Int32
	waiting.Store(4)
	var failing atomic.Bool
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, page(fmt.Sprint(waiting.Load()), "0.5"))
	}))
	defer engine.Close()
	sglang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, "sglang:num_running_reqs 3\nsglang:num_queue_reqs 1\nsglang:token_usage 0.2\n")
	}))
	defer sglang.Close()

	workers := []Worker{{Name: "vllm", Address: engine.Listener.Addr().String()}, {Name: "sglang", Address: sglang.Listener.Addr().String()}}
	s, err := New(DefaultConfig(), workers, nil, nil, nil)
	require.NoError(t, err)
	s.CapacityOnly() // the kv picker's scraper: it reads no load signals, but counts requests
	r := &reports{last: map[string]int{}}
	s.ReportRequests(r.report)
	ctx := context.Background()

	s.ScrapeAll(ctx)
	n, _ := r.get("vllm")
	assert.Equal(t, 9, n, "5 running + 4 waiting")
	n, ok := r.get("sglang")
	assert.True(t, ok)
	assert.Equal(t, -1, n, "a page without vLLM's metrics gives no count")

	waiting.Store(0)
	s.ScrapeAll(ctx)
	n, _ = r.get("vllm")
	assert.Equal(t, 5, n)

	failing.Store(true)
	s.ScrapeAll(ctx)
	n, _ = r.get("vllm")
	assert.Equal(t, -1, n, "a failed scrape withdraws the count: the engine's word is not kept past its scrape")

	failing.Store(false)
	s.ScrapeAll(ctx)
	s.SetWorkers([]Worker{{Name: "vllm", Address: "127.0.0.1:1"}, workers[1]})
	n, _ = r.get("vllm")
	assert.Equal(t, -1, n, "a worker at a new address is another engine: the old one's count is withdrawn")
	s.SetWorkers(workers)
	s.ScrapeAll(ctx)
	n, _ = r.get("vllm")
	require.Equal(t, 5, n)
	s.SetWorkers(workers[1:])
	n, _ = r.get("vllm")
	assert.Equal(t, -1, n, "a removed worker's count is withdrawn")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	r.report("sglang", 42)
	s.ScrapeAll(cancelled)
	n, _ = r.get("sglang")
	assert.Equal(t, 42, n, "a scrape cut short by shutdown reports nothing")

	cfg := DefaultConfig()
	cfg.RunningMetric, cfg.WaitingMetric = "sglang:num_running_reqs", "sglang:num_queue_reqs"
	s, err = New(cfg, workers[1:], nil, nil, nil)
	require.NoError(t, err)
	s.ReportRequests(r.report)
	s.ScrapeAll(ctx)
	n, _ = r.get("sglang")
	assert.Equal(t, 4, n, "SGLang's names, configured")
}

func TestUnseenRequestsNeedARunningMetric(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RunningMetric = ""
	assert.EqualError(t, cfg.Validate(), "engine_metrics.running_metric: must not be empty with unseen_requests on")
	cfg.UnseenRequests = false
	assert.NoError(t, cfg.Validate())
}

func FuzzParseRequests(f *testing.F) {
	f.Add(page("3", "0.5"))
	f.Add("vllm:num_requests_running{engine=\"0\"} 2\nvllm:num_requests_running{engine=\"1\"} 1e300\nvllm:num_requests_waiting 0\n")
	f.Add("vllm:num_requests_running NaN\nvllm:num_requests_waiting -0\n")
	f.Add("# TYPE vllm:num_requests_running histogram\nvllm:num_requests_running_bucket{le=\"1\"} 1\nvllm:num_requests_waiting 1\n")
	f.Fuzz(func(t *testing.T, page string) {
		n, err := ParseRequests([]byte(page), "vllm:num_requests_running", "vllm:num_requests_waiting")
		if err == nil && (n < 0 || n > 2*MaxWaiting) {
			t.Fatalf("%d requests from %q: outside [0, %d]", n, page, 2*MaxWaiting)
		}
	})
}
