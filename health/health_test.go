package health

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/background/backgroundtest"
	"github.com/kvroute/kvroute/internal/fakeclock"
	"github.com/kvroute/kvroute/internal/h2ctest"
)

func newTracker(t *testing.T, cfg Config, deps Deps, workers ...Worker) (*Tracker, *fakeclock.Clock) {
	t.Helper()
	clock := fakeclock.New(time.Unix(1000, 0))
	deps.Now = clock.Now
	tr, err := New(cfg, workers, deps)
	require.NoError(t, err)
	return tr, clock
}

// passive is a config without probes: only responses count.
func passive() Config {
	c := DefaultConfig()
	c.Interval = 0
	return c
}

func TestResponsesTakeAWorkerOutAndBackIn(t *testing.T) {
	var downs []string
	tr, clock := newTracker(t, passive(), Deps{OnDown: func(w string) { downs = append(downs, w) }}, Worker{Name: "a"}, Worker{Name: "b"})

	tr.Observe("a", "", 503)
	assert.True(t, tr.Eligible("a"), "one failure is below the threshold of 2")
	tr.Observe("a", "", 200)
	tr.Observe("a", "", 500)
	assert.True(t, tr.Eligible("a"), "a success resets the consecutive count")
	tr.Observe("a", "", 400)
	tr.Observe("a", "", 404)
	assert.True(t, tr.Eligible("a"), "client errors say nothing of the worker")
	tr.Observe("a", "", 502)
	assert.False(t, tr.Eligible("a"), "two consecutive 5xx take it out")
	assert.True(t, tr.Eligible("b"))
	assert.Equal(t, []string{"a"}, downs, "OnDown is told once")

	clock.Advance(1999 * time.Millisecond)
	assert.False(t, tr.Eligible("a"), "out for backoff_min")
	clock.Advance(time.Millisecond)
	assert.True(t, tr.Eligible("a"), "without probes it rejoins on trial when the back-off ends")

	tr.Observe("a", "", 500)
	assert.False(t, tr.Eligible("a"), "a failure on trial sends it back at once")
	assert.Equal(t, []string{"a", "a"}, downs)
	clock.Advance(3 * time.Second)
	assert.False(t, tr.Eligible("a"), "for twice as long: 4 s")
	clock.Advance(time.Second)
	require.True(t, tr.Eligible("a"))
	tr.Observe("a", "", 200)
	tr.Observe("a", "", 500)
	assert.True(t, tr.Eligible("a"), "back in after a success on trial: the threshold applies again")
}

func TestBackoffIsCapped(t *testing.T) {
	cfg := passive()
	cfg.BackoffMin, cfg.BackoffMax = time.Second, 3*time.Second
	tr, clock := newTracker(t, cfg, Deps{}, Worker{Name: "a"})
	tr.Observe("a", "", 500)
	tr.Observe("a", "", 500)
	for _, want := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second} {
		clock.Advance(want - time.Millisecond)
		assert.False(t, tr.Eligible("a"), "out for %s", want)
		clock.Advance(time.Millisecond)
		require.True(t, tr.Eligible("a"))
		tr.Observe("a", "", 500)
	}
}

// A worker that goes out again soon after it came back (one that passes probes but
// fails routed requests, or flaps) did not recover: it is out twice as long as last
// time. Before, every rejoin reset its back-off, so it was out backoff_min each cycle
// and took its share of requests between. Healthy for backoff_max, it starts afresh.
func TestAWorkerOutAgainSoonAfterRejoiningStaysOutLonger(t *testing.T) {
	cfg := passive()
	cfg.BackoffMin, cfg.BackoffMax = time.Second, 8*time.Second
	tr, clock := newTracker(t, cfg, Deps{}, Worker{Name: "a"})
	goOut := func() {
		tr.Observe("a", "", 500)
		tr.Observe("a", "", 500)
	}
	outFor := func(step string, want time.Duration) {
		t.Helper()
		clock.Advance(want - time.Millisecond)
		assert.False(t, tr.Eligible("a"), "%s: out for %s", step, want)
		clock.Advance(time.Millisecond)
		require.True(t, tr.Eligible("a"), "%s: back after %s", step, want)
		tr.Observe("a", "", 200) // rejoins
	}
	steps := []struct {
		name    string
		healthy time.Duration // since it rejoined, before it goes out again
		want    time.Duration
	}{
		{"first time out", 0, time.Second},
		{"out again at once", 0, 2 * time.Second},
		{"out again within backoff_max", 7 * time.Second, 4 * time.Second},
		{"and again", time.Second, 8 * time.Second},
		{"capped at backoff_max", 0, 8 * time.Second},
		{"healthy for backoff_max: afresh", 8 * time.Second, time.Second},
	}
	for _, st := range steps {
		clock.Advance(st.healthy)
		goOut()
		outFor(st.name, st.want)
	}
}

func TestUnknownWorkersAreEligibleAndIgnored(t *testing.T) {
	tr, _ := newTracker(t, passive(), Deps{}, Worker{Name: "a"})
	tr.Observe("ghost", "", 500)
	tr.Observe("ghost", "", 500)
	assert.True(t, tr.Eligible("ghost"))
}

func TestProbesTakeADeadWorkerOutAndBringItBack(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" || !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadAddr := dead.Listener.Addr().String()
	dead.Close() // nothing listens there now: connect refused

	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	tr, clock := newTracker(t, DefaultConfig(), Deps{Metrics: m},
		Worker{Name: "live", Address: srv.Listener.Addr().String()}, Worker{Name: "dead", Address: deadAddr})
	ctx := context.Background()
	tr.ProbeAll(ctx)
	tr.ProbeAll(ctx)
	assert.True(t, tr.Eligible("live"))
	assert.False(t, tr.Eligible("dead"), "connect refused twice")
	assert.Equal(t, 2.0, testutil.ToFloat64(m.failures.WithLabelValues("dead", SourceProbe)))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.eligible.WithLabelValues("dead")))

	healthy.Store(false)
	tr.ProbeAll(ctx)
	tr.ProbeAll(ctx)
	assert.False(t, tr.Eligible("live"), "a non-200 health answer is a failure")

	clock.Advance(time.Minute)
	assert.False(t, tr.Eligible("live"), "with probes on, the end of the back-off is not enough: it must answer")
	healthy.Store(true)
	tr.ProbeAll(ctx)
	assert.True(t, tr.Eligible("live"))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.eligible.WithLabelValues("live")))

	n, err := testutil.GatherAndCount(reg, "kvroute_worker_eligible", "kvroute_worker_health_failures_total")
	require.NoError(t, err)
	assert.Equal(t, 4, n, "two eligibility gauges, two failure series (probe failures of each worker)")
}

func TestAProbeSuccessDuringTheBackoffWaitsForItsEnd(t *testing.T) {
	tr, clock := newTracker(t, DefaultConfig(), Deps{}, Worker{Name: "a"})
	tr.fail("a", "", SourceProbe, "x")
	tr.fail("a", "", SourceProbe, "x")
	tr.succeed("a", "")
	assert.False(t, tr.Eligible("a"), "the back-off is served even if the worker answers")
	clock.Advance(2 * time.Second)
	assert.True(t, tr.Eligible("a"), "and then it is back without another probe")
}

func TestRunProbesUntilCancelled(t *testing.T) {
	var probes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { probes.Add(1) }))
	defer srv.Close()
	cfg := DefaultConfig()
	cfg.Interval = time.Millisecond
	tr, err := New(cfg, []Worker{{Name: "a", Address: srv.Listener.Addr().String()}}, Deps{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tr.Run(ctx); close(done) }()
	require.Eventually(t, func() bool { return probes.Load() >= 3 }, 10*time.Second, time.Millisecond)
	cancel()
	<-done
	assert.True(t, tr.Eligible("a"))

	off, err := New(passive(), nil, Deps{})
	require.NoError(t, err)
	off.Run(context.Background()) // returns at once with probing off
}

func TestConfigErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{"negative interval", func(c *Config) { c.Interval = -1 }, "health.interval"},
		{"relative path", func(c *Config) { c.Path = "health" }, "health.path"},
		{"zero timeout", func(c *Config) { c.Timeout = 0 }, "health.timeout"},
		{"zero threshold", func(c *Config) { c.UnhealthyThreshold = 0 }, "health.unhealthy_threshold"},
		{"zero backoff", func(c *Config) { c.BackoffMin = 0 }, "health.backoff_min"},
		{"max below min", func(c *Config) { c.BackoffMax = time.Second }, "health.backoff_max"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.modify(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), tt.want), err.Error())
		})
	}
	assert.NoError(t, passive().Validate(), "without probes, path and timeout do not matter")
}

func TestSetWorkersKeepsTheHealthOfWorkersThatStay(t *testing.T) {
	reg := prometheus.NewRegistry()
	tr, _ := newTracker(t, passive(), Deps{Metrics: NewMetrics(reg)}, Worker{Name: "a"}, Worker{Name: "b"})
	for range 2 {
		tr.Observe("a", "", 500)
		tr.Observe("b", "", 500)
	}
	require.False(t, tr.Eligible("a"))

	tr.SetWorkers([]Worker{{Name: "a"}, {Name: "c"}})
	assert.False(t, tr.Eligible("a"), "a stays out")
	assert.True(t, tr.Eligible("c"), "a new worker starts healthy")
	assert.True(t, tr.Eligible("b"), "a removed worker is forgotten (unknown names are eligible)")
	assert.Equal(t, int32(1), tr.outCount.Load(), "b no longer counts as out")
	n, err := testutil.GatherAndCount(reg, "kvroute_worker_eligible")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "b's series are gone")
	n, err = testutil.GatherAndCount(reg, "kvroute_worker_health_failures_total")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only a's failures remain")
}

func TestANewAddressStartsHealthy(t *testing.T) {
	tr, _ := newTracker(t, passive(), Deps{}, Worker{Name: "a", Address: "10.0.0.1:80"})
	tr.Observe("a", "", 500)
	tr.Observe("a", "", 500)
	require.False(t, tr.Eligible("a"))
	tr.SetWorkers([]Worker{{Name: "a", Address: "10.0.0.1:80"}})
	assert.False(t, tr.Eligible("a"), "same address: still out")
	tr.SetWorkers([]Worker{{Name: "a", Address: "10.0.0.2:80"}})
	assert.True(t, tr.Eligible("a"), "another engine behind the name")
	assert.Equal(t, int32(0), tr.outCount.Load())
}

// TestAProbeOfAnOldAddressSaysNothingOfTheNewOne: a probe that was in flight to a
// worker's old address when the worker moved (a pod restarted under its name) is the
// old engine's answer: it must not count against the engine now at the new address.
func TestAProbeOfAnOldAddressSaysNothingOfTheNewOne(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(arrived)
		<-release
		w.WriteHeader(http.StatusServiceUnavailable) // the old engine, going away
	}))
	defer old.Close()
	cfg := DefaultConfig()
	cfg.UnhealthyThreshold = 1
	var downs atomic.Int32
	tr, _ := newTracker(t, cfg, Deps{OnDown: func(string) { downs.Add(1) }}, Worker{Name: "a", Address: old.Listener.Addr().String()})

	probed := make(chan struct{})
	go func() { tr.ProbeAll(context.Background()); close(probed) }()
	<-arrived
	tr.SetWorkers([]Worker{{Name: "a", Address: "192.0.2.1:80"}}) // moved while the probe runs
	close(release)
	<-probed

	assert.True(t, tr.Eligible("a"), "the old engine's failure is not the new one's")
	assert.Zero(t, downs.Load(), "the new engine's index is not cleared for the old one's failure")
}

// TestAResponseFromAnOldAddressSaysNothingOfTheNewOne: requests still on a worker's old
// engine when it moved (a pod restarted under its name) fail as that engine goes
// away; their 5xx answers do not take out the engine at the new address, whose own
// answers still count.
func TestAResponseFromAnOldAddressSaysNothingOfTheNewOne(t *testing.T) {
	var downs []string
	cfg := passive()
	tr, _ := newTracker(t, cfg, Deps{OnDown: func(w string) { downs = append(downs, w) }}, Worker{Name: "a", Address: "10.0.0.1:8000"})
	tr.SetWorkers([]Worker{{Name: "a", Address: "10.0.0.2:8000"}})
	for range cfg.UnhealthyThreshold + 1 {
		tr.Observe("a", "10.0.0.1:8000", 503)
	}
	assert.True(t, tr.Eligible("a"), "the old engine's failures are not the new one's")
	assert.Empty(t, downs)
	for range cfg.UnhealthyThreshold {
		tr.Observe("a", "10.0.0.2:8000", 503)
	}
	assert.False(t, tr.Eligible("a"), "the new engine's own failures count")
	assert.Equal(t, []string{"a"}, downs)
}

// An h2c pool's engines may speak HTTP/2 over cleartext alone: a worker said to speak
// h2c is probed so, the others over HTTP/1.1, and neither protocol is guessed.
func TestProbesSpeakEachWorkersProtocol(t *testing.T) {
	tests := []struct {
		name        string
		h2cOnly     bool // the engine refuses HTTP/1.1
		workerH2C   bool
		wantHealthy bool
		wantProto   string // the protocol of the probes the engine answered
	}{
		{"an HTTP/1.1 worker is probed over HTTP/1.1", false, false, true, "HTTP/1.1"},
		{"an h2c worker is probed over h2c", true, true, true, "HTTP/2.0"},
		{"an h2c-only engine refuses HTTP/1.1 probes: the worker must say h2c", true, false, false, ""},
		{"an HTTP/1.1 engine refuses h2c probes", false, true, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var proto atomic.Value
			proto.Store("")
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/health" { // not an HTTP/1.1 server's "PRI *": h2c's preface, which it hands on
					proto.Store(r.Proto)
				}
			})
			srv := h2ctest.NewEngine(t, h, tt.h2cOnly)
			tr, _ := newTracker(t, DefaultConfig(), Deps{}, Worker{Name: "a", Address: srv.Listener.Addr().String(), H2C: tt.workerH2C})
			tr.ProbeAll(context.Background())
			tr.ProbeAll(context.Background())
			assert.Equal(t, tt.wantHealthy, tr.Eligible("a"), "two probes: out if both failed")
			assert.Equal(t, tt.wantProto, proto.Load())
		})
	}
}

// TestAProbeThatPanicsFailsThatWorkersProbeAlone: a panic while one worker's probe is
// read (a bug its answer reached) is recovered and counted, and is a failed probe of
// that worker: the other worker of the round is probed, and the next round probes
// both again.
func TestAProbeThatPanicsFailsThatWorkersProbeAlone(t *testing.T) {
	engine := func() string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		t.Cleanup(srv.Close)
		return srv.Listener.Addr().String()
	}
	a, b := engine(), engine()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	cfg := DefaultConfig()
	cfg.UnhealthyThreshold = 1
	tr, clock := newTracker(t, cfg, Deps{Metrics: m, Panics: background.NewMetrics(reg),
		Client: &http.Client{Transport: &backgroundtest.PanicOnce{Host: a}}}, Worker{Name: "a", Address: a}, Worker{Name: "b", Address: b})

	tr.ProbeAll(context.Background())
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopHealth))
	assert.False(t, tr.Eligible("a"), "the panicking probe failed")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.failures.WithLabelValues("a", SourceProbe)))
	assert.True(t, tr.Eligible("b"), "the other worker's probe went on")
	assert.Equal(t, 0.0, testutil.ToFloat64(m.failures.WithLabelValues("b", SourceProbe)))

	clock.Advance(cfg.BackoffMin)
	tr.ProbeAll(context.Background())
	assert.True(t, tr.Eligible("a"), "the next round probed it again")
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopHealth), "one panic, counted once")
}
