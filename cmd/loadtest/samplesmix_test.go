package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/sim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSamplesMix(t *testing.T) {
	tests := []struct {
		in   string
		want []sampleClass
		err  string
	}{
		{"", nil, ""},
		{"1:12,16:4", []sampleClass{{1, 12}, {16, 4}}, ""},
		{"8:2, 1:3", []sampleClass{{8, 2}, {1, 3}}, ""},
		{"256:1", []sampleClass{{256, 1}}, ""},
		{"16", nil, `"16" is not samples:streams`},
		{"0:4", nil, `samples "0" must be 1-256`},
		{"257:1", nil, "must be 1-256"},
		{"x:1", nil, `samples "x" must be`},
		{"16:0", nil, "16's streams must be a whole number ≥ 1"},
		{"16:-1", nil, `16's streams must be a whole number ≥ 1, got "-1"`},
		{"16:1:2", nil, `got "1:2"`},
		{"1:2,1:3", nil, `"1" given twice`},
		{"1:2,", nil, `"" is not samples:streams`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseSamplesMix(tt.in)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	pairs := make([]string, maxSampleClasses+1)
	for i := range pairs {
		pairs[i] = fmt.Sprintf("%d:1", i+1)
	}
	_, err := parseSamplesMix(strings.Join(pairs[:maxSampleClasses], ","))
	require.NoError(t, err)
	_, err = parseSamplesMix(strings.Join(pairs, ","))
	assert.ErrorContains(t, err, fmt.Sprintf("at most %d classes", maxSampleClasses))
}

func TestSamplesMixFlagsAreValidated(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"-streams beside the mix", []string{"-api", "generate", "-samples-mix", "1:2", "-streams", "2"}, "without -streams and -samples"},
		{"-samples beside the mix", []string{"-api", "generate", "-samples-mix", "1:2", "-samples", "1"}, "without -streams and -samples"},
		{"-tenants beside the mix", []string{"-api", "generate", "-samples-mix", "1:2", "-tenants", "a:2"}, "-samples-mix and -tenants: give one"},
		{"a bad mix", []string{"-api", "generate", "-samples-mix", "1:none"}, "-samples-mix: 1's streams must be a whole number"},
		{"a chat mix", []string{"-samples-mix", "1:2,4:1"}, "-samples-mix: only with -api generate"},
		{"a group past max-num-seqs", []string{"-api", "generate", "-samples-mix", "1:2,16:1", "-max-num-seqs", "8"}, "at most -max-num-seqs"},
		{"over 20000 streams", []string{"-api", "generate", "-samples-mix", "1:20000,2:1"}, "-streams: must be 1-20000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			assert.Equal(t, 2, cli(tt.args, &stdout, &stderr))
			assert.Contains(t, stderr.String(), tt.want)
		})
	}
	mix := []sampleClass{{1, 12}, {16, 4}}
	requireValidation(t, []optionsCase{
		{"a mix of generate", func(o *options) { o.load.api, o.load.samplesMix, o.streams = apiGenerate, mix, 16 }, ""},
		{"a mix within max-num-seqs", func(o *options) {
			o.load.api, o.load.samplesMix, o.streams, o.maxNumSeqs = apiGenerate, mix, 16, 16
		}, ""},
		{"a mix past max-num-seqs", func(o *options) {
			o.load.api, o.load.samplesMix, o.streams, o.maxNumSeqs = apiGenerate, mix, 16, 15
		}, "-samples-mix: each class's samples must be at most -max-num-seqs"},
		{"a mix of sglang", func(o *options) { o.load.api, o.load.samplesMix, o.streams = apiSGLang, mix, 16 }, "-samples-mix: only with -api generate"},
		{"a mix beside -samples", func(o *options) {
			o.load.api, o.load.samplesMix, o.streams, o.load.samples = apiGenerate, mix, 16, 2
		}, "-samples-mix: give it without -samples"},
		{"the mix's streams are not -streams", func(o *options) { o.load.api, o.load.samplesMix, o.streams = apiGenerate, mix, 200 }, "-samples-mix: its 16 streams"},
	})
}

func TestStreamsAreTheSampleClassesInTheFlagsOrder(t *testing.T) {
	mix := []sampleClass{{1, 3}, {16, 2}}
	assert.Equal(t, []int{1, 1, 1, 16, 16}, groupKeys(mix))
	assert.Nil(t, groupKeys[int](nil))
	assert.Equal(t, 5, groupStreams(mix))
	assert.Equal(t, 35, mixSequences(mix))
	assert.Equal(t, "1:3,16:2", groupList(mix))

	w := defaultOptions().load
	w.api, w.samplesMix = apiGenerate, mix
	g := newGenerator(w, 5)
	for id, want := range []int{1, 1, 1, 16, 16} {
		assert.Equal(t, want, g.streamSamples(id), "stream %d", id)
	}
	w.samplesMix, w.samples = nil, 4
	assert.Equal(t, 4, newGenerator(w, 5).streamSamples(3), "without a mix, -samples")
}

// TestEnginesGetTheMixsSequences: without -max-num-seqs the engines get slots for
// every class's sequences, as for -samples.
func TestEnginesGetTheMixsSequences(t *testing.T) {
	o := defaultOptions()
	o.load.api, o.load.samplesMix, o.streams, o.workers = apiGenerate, []sampleClass{{1, 12}, {16, 4}}, 16, 4
	assert.Equal(t, 76/4+8, engineConfig(o, 16).MaxNumSeqs)
	o.maxNumSeqs = 32
	assert.Equal(t, 32, engineConfig(o, 16).MaxNumSeqs)
}

// TestSampleClassesAskForTheirSamples runs a stream of each class of the mix 1:1,4:1
// against a mockworker: the first stream's bodies send no n, the second's n 4, and
// each class's requests, TTFTs and workers are measured apart, and together in the
// overall figures.
func TestSampleClassesAskForTheirSamples(t *testing.T) {
	w := defaultOptions().load
	w.api, w.samplesMix = apiGenerate, []sampleClass{{1, 1}, {4, 1}}
	w.prefixTokens, w.userTokens, w.maxPromptTokens, w.outputTokens = 64, 8, 10000, 4
	worker, err := mockworker.New(mockworker.Config{Name: "w0", Speed: 1000, DefaultMaxTokens: 16, Seed: 1,
		Engine: sim.Config{BlockSize: 16, MaxNumSeqs: 8, NumGPUBlocks: 4096, MaxBatchedTokens: 8192}})
	require.NoError(t, err)
	defer worker.Close()
	var mu sync.Mutex
	ns := map[int]int{} // requests by the n their body asked for (0: none)
	h := worker.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b struct {
			SamplingParams struct {
				N *int `json:"n"`
			} `json:"sampling_params"`
		}
		if assert.NoError(t, json.Unmarshal(body, &b)) {
			mu.Lock()
			if b.SamplingParams.N == nil {
				ns[0]++
			} else {
				ns[*b.SamplingParams.N]++
			}
			mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(rw, r)
	}))
	defer srv.Close()

	g := newGenerator(w, 2)
	g.urls = []string{srv.URL}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for id := range 2 {
		wg.Go(func() { g.stream(ctx, context.Background(), id) })
	}
	m := g.cur.Load()
	require.Eventually(t, func() bool { return m.classes[1].completed.Load() >= 3 && m.classes[4].completed.Load() >= 3 },
		10*time.Second, 5*time.Millisecond)
	cancel()
	wg.Wait()
	assert.Zero(t, g.errorCount(), "errors: %v", g.errs)

	mu.Lock()
	assert.Positive(t, ns[0], "single samples send no n")
	assert.Positive(t, ns[4], "the group's requests ask for 4")
	assert.Len(t, ns, 2, "no other n: %v", ns)
	mu.Unlock()

	reports := classReports(w.samplesMix, m, 1, 2)
	require.Len(t, reports, 2)
	var completed int64
	for _, r := range reports {
		c := m.classes[r.Samples]
		assert.Equal(t, c.completed.Load(), r.Requests)
		assert.Equal(t, r.Requests, r.TTFT.Count, "n=%d: one TTFT a request", r.Samples)
		assert.Equal(t, r.Requests, sum(r.PerWorker), "n=%d: every request counted by the worker that answered", r.Samples)
		assert.Equal(t, r.Requests-1, r.Resumed, "n=%d: one session, its later turns resumed", r.Samples)
		assert.InDelta(t, 1, r.MaxOverMean, 1e-9, "one worker")
		assert.Zero(t, r.Moved)
		assert.InDelta(t, float64(r.Requests)/2, r.RequestsPerSec, 1e-9)
		completed += r.Requests
	}
	assert.Equal(t, []int{1, 4}, []int{reports[0].Samples, reports[1].Samples}, "in the flag's order")
	assert.Equal(t, m.completed.Load(), completed, "the classes make up the whole")
	assert.Equal(t, m.ttft.count(), reports[0].TTFT.Count+reports[1].TTFT.Count)
}

// TestReportPrintsEachSampleClass: the printed report names the mix and has a row for
// each class.
func TestReportPrintsEachSampleClass(t *testing.T) {
	o := defaultOptions()
	o.load.api, o.load.samplesMix, o.streams = apiGenerate, []sampleClass{{1, 2}, {16, 1}}, 3
	r := &report{opts: o, SampleClasses: []classReport{
		{Samples: 1, Streams: 2, Requests: 10, Resumed: 8, Moved: 1, PerWorker: map[string]int64{"w0": 6, "w1": 4}, MaxOverMean: 1.2},
		{Samples: 16, Streams: 1, Requests: 3, Resumed: 2, PerWorker: map[string]int64{"w1": 3}, MaxOverMean: 2},
	}}
	var b strings.Builder
	r.print(&b)
	out := b.String()
	assert.Contains(t, out, "-samples-mix 1:2,16:1")
	assert.Contains(t, out, "18 sequences at once")
	assert.Regexp(t, `n=1\s+2\s+10\s+0\.0\s+1/8\s+1\.20`, out)
	assert.Regexp(t, `n=16\s+1\s+3\s+0\.0\s+0/2\s+2\.00`, out)
	assert.Contains(t, out, "n=1 requests per worker: w0 6 w1 4")
	assert.Contains(t, out, "n=16 requests per worker: w1 3")
}

// TestReportGivesSamplesPerRequest: the report's samples_per_request is -samples, and 0
// with -samples-mix, whose classes sample_classes gives apart.
func TestReportGivesSamplesPerRequest(t *testing.T) {
	for _, tt := range []struct {
		name    string
		samples int
		mix     []sampleClass
		want    int
	}{
		{"single samples", 1, nil, 1},
		{"groups of 8", 8, nil, 8},
		{"a mix", 1, []sampleClass{{1, 2}, {16, 1}}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := defaultOptions()
			o.load.api, o.load.samples, o.load.samplesMix = apiGenerate, tt.samples, tt.mix
			g := newGenerator(o.load, 3)
			r := &report{opts: o, measureStart: time.Unix(0, 0), measureEnd: time.Unix(10, 0)}
			r.fill(g, g.cur.Load(), snapshot{}, snapshot{}, snapshot{}, snapshot{})
			assert.Equal(t, tt.want, r.SamplesPerRequest)
			assert.Len(t, r.SampleClasses, len(tt.mix))
		})
	}
}
