package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
)

func TestHostileBodiesAreWhatTheyClaim(t *testing.T) {
	tests := []struct {
		kind     hostileKind
		endpoint openai.Endpoint
		fill     string // the prompt's only characters (completions)
	}{
		{hostileDigits, openai.Completions, "0123456789"},
		{hostileSpaces, openai.Completions, " "},
		{hostileLetter, openai.Completions, "a"},
		{hostileTinyJSON, openai.ChatCompletions, ""},
	}
	for _, tt := range tests {
		for _, size := range []int{minHostileBytes, 64<<10 + 1, 4 << 20} {
			t.Run(fmt.Sprintf("%s/%d", tt.kind, size), func(t *testing.T) {
				bodies := tt.kind.body("mock", size)
				if tt.endpoint == openai.Completions {
					prompts := map[string]bool{}
					for _, v := range []int{0, 1, 2, hostileVariants - 1, hostileVariants} {
						body, err := io.ReadAll(bodies.reader(v))
						require.NoError(t, err)
						require.Len(t, body, size, "variant %d: exactly -hostile-bytes", v)
						req, err := openai.Parse(tt.endpoint, body, openai.DefaultLimits())
						require.NoError(t, err, "variant %d: kvroute's parser accepts it", v)
						assert.Equal(t, "mock", req.Model)
						assert.Greater(t, len(req.Prompt), size-64-hostileVariants, "the prompt is nearly all of the body")
						assert.Empty(t, strings.Trim(req.Prompt, tt.fill), "the prompt holds %q alone", tt.fill)
						assert.True(t, strings.HasPrefix(tt.fill, req.Prompt[:1]))
						prompts[req.Prompt] = true
					}
					assert.Len(t, prompts, 4, "variants differ, and repeat after hostileVariants")
					return
				}
				body, err := io.ReadAll(bodies.reader(7))
				require.NoError(t, err)
				require.Len(t, body, size, "exactly -hostile-bytes")
				req, err := openai.Parse(tt.endpoint, body, openai.DefaultLimits())
				require.NoError(t, err, "kvroute's parser accepts it")
				assert.Equal(t, "mock", req.Model)
				require.NotNil(t, req.Chat)
				if size > 64<<10 {
					// The shape the value budget is for: too dense to materialise.
					assert.Error(t, req.Chat.Unread, "over the parser's value budget")
					return
				}
				require.NoError(t, req.Chat.Unread)
				require.Len(t, req.Chat.Messages, 1)
			})
		}
	}
}

func TestParseHostileKinds(t *testing.T) {
	tests := []struct {
		in   string
		want []hostileKind
		err  string
	}{
		{"", nil, ""},
		{"digits", []hostileKind{hostileDigits}, ""},
		{"digits,tiny-json", []hostileKind{hostileDigits, hostileTinyJSON}, ""},
		{"spaces, letter", []hostileKind{hostileSpaces, hostileLetter}, ""},
		{"digit", nil, `unknown kind "digit"`},
		{"digits,", nil, `unknown kind ""`},
		{"digits,digits", nil, "given twice"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseHostileKinds(tt.in)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestHostileFlagsAreValidated(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in stderr; "" for a valid command line (not run here)
	}{
		{"unknown kind", []string{"-hostile-streams", "2", "-hostile-kind", "zeros"}, `-hostile-kind: unknown kind "zeros"`},
		{"streams without a kind", []string{"-hostile-streams", "2"}, "-hostile-streams: needs -hostile-kind"},
		{"a kind without streams", []string{"-hostile-kind", "digits"}, "-hostile-kind: needs -hostile-streams"},
		{"too many streams", []string{"-hostile-streams", "65", "-hostile-kind", "digits"}, "-hostile-streams: must be 0-64"},
		{"negative streams", []string{"-hostile-streams", "-1", "-hostile-kind", "digits"}, "-hostile-streams: must be 0-64"},
		{"a body past the data plane's buffer", []string{"-hostile-streams", "1", "-hostile-kind", "digits", "-hostile-bytes", "4194305"}, "-hostile-bytes: must be 4096-4194304"},
		{"a body too small for its JSON", []string{"-hostile-streams", "1", "-hostile-kind", "digits", "-hostile-bytes", "4095"}, "-hostile-bytes: must be 4096-4194304"},
		{"a negative interval", []string{"-hostile-streams", "1", "-hostile-kind", "digits", "-hostile-interval", "-1s"}, "-hostile-interval: must be ≥ 0"},
		{"no /proc interval", []string{"-proc-sample", "0s"}, "-proc-sample: must be > 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := cli(tt.args, &stdout, &stderr)
			assert.Equal(t, 2, code)
			assert.Contains(t, stderr.String(), tt.want)
		})
	}
}

func TestHostileOptionsAreBounded(t *testing.T) {
	requireValidation(t, []optionsCase{
		{"none", func(*options) {}, ""},
		{"two kinds, 4 MiB", func(o *options) {
			o.hostileStreams, o.hostileKinds = 2, []hostileKind{hostileDigits, hostileTinyJSON}
		}, ""},
		{"the smallest body", func(o *options) {
			o.hostileStreams, o.hostileKinds, o.hostileBytes = 1, []hostileKind{hostileSpaces}, minHostileBytes
		}, ""},
		{"no kind", func(o *options) { o.hostileStreams = 1 }, "-hostile-streams: needs -hostile-kind"},
		{"no stream", func(o *options) { o.hostileKinds = []hostileKind{hostileLetter} }, "-hostile-kind: needs"},
		{"a body past the buffer", func(o *options) {
			o.hostileStreams, o.hostileKinds, o.hostileBytes = 1, []hostileKind{hostileDigits}, dataPlaneBuffer+1
		}, "-hostile-bytes"},
	})
}

func TestWorkersRefuseHostileRequestsAlone(t *testing.T) {
	tests := []struct {
		name    string
		hostile string
		status  int
		refused string
	}{
		{"a legitimate request is served", "", http.StatusTeapot, ""},
		{"a hostile one is refused, naming the worker", "digits", http.StatusBadRequest, "w3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			served := false
			h := refuseHostile("w3", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				served = true
				w.WriteHeader(http.StatusTeapot)
			}))
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"0000"}`))
			if tt.hostile != "" {
				req.Header.Set(hostileHeader, tt.hostile)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			assert.Equal(t, tt.status, rec.Code)
			assert.Equal(t, tt.refused, rec.Header().Get(hostileRefusedHeader))
			assert.Equal(t, tt.hostile == "", served)
		})
	}
}

func TestHostileReportCountsEachOutcome(t *testing.T) {
	c := newHostileClient([]hostileKind{hostileDigits, hostileTinyJSON}, "mock", minHostileBytes, 2, time.Minute)
	c.count(hostileDigits, "routed", "w0", 100*time.Millisecond)
	c.count(hostileDigits, "routed", "w1", 200*time.Millisecond)
	c.count(hostileDigits, "status 504", "upstream request timeout", 2*time.Second)
	got := c.report(2, 10)
	require.Len(t, got, 2)
	d := got["digits"]
	assert.Equal(t, int64(3), d.Sent)
	assert.InDelta(t, 0.3, d.PerSec, 1e-9)
	assert.Equal(t, map[string]int64{"routed": 2, "status 504": 1}, d.Outcomes)
	assert.Equal(t, "w0", d.Examples["routed"], "the first message of each outcome")
	assert.Equal(t, minHostileBytes, d.Bytes)
	assert.Zero(t, got["tiny-json"].Sent)
}

func TestParseProcStat(t *testing.T) {
	status := "Name:\textproc\nVmPeak:\t 2000 kB\nVmHWM:\t  4096 kB\nVmRSS:\t  2048 kB\nThreads:\t9\n"
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime …
	stat := "1234 (ext proc) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0\n"
	tests := []struct {
		name, status, stat string
		want               procStat
		err                string
	}{
		{"a command name with a space", status, stat, procStat{rss: 2 << 20, hwm: 4 << 20, cpu: 3 * time.Second}, ""},
		{"no VmHWM", "VmRSS:\t 2048 kB\n", stat, procStat{}, "no VmRSS or VmHWM"},
		{"a unit other than kB", "VmRSS:\t 2 MB\nVmHWM:\t 4 MB\n", stat, procStat{}, "unexpected"},
		{"a short stat", status, "1234 (x) S 1 2 3\n", procStat{}, "fields after the name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseProcStat([]byte(tt.status), []byte(tt.stat))
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestReadProcStatOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	got, err := readProcStat(os.Getpid())
	require.NoError(t, err)
	assert.Positive(t, got.rss)
	assert.GreaterOrEqual(t, got.hwm, got.rss, "the peak is at least the current RSS")
}
