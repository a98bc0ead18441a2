package main

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/flowcontrol"
)

// A tenant is a group of streams whose requests name one fairness id (-tenants), its
// key: the flows kvroute's flow control takes turns between, so a noisy tenant's load
// and a quiet one's can be told apart in the report.
type tenant = streamGroup[string]

// maxTenants bounds -tenants: each tenant keeps two histograms, and the report a row.
const maxTenants = 64

// parseTenants reads -tenants: comma-separated name:streams pairs, e.g. "a:15,b:1".
// A name is a fairness id kvroute reads as one (flowcontrol.ValidFairnessID) with no
// ':' or ','; each tenant has at least one stream, and no name comes twice. "" is no
// tenants: the load test as without the flag.
func parseTenants(s string) ([]tenant, error) {
	return parseGroups("-tenants", "name", "tenants", maxTenants, s, func(name string) (string, error) {
		if !flowcontrol.ValidFairnessID(name) || strings.ContainsAny(name, ":,") {
			return "", fmt.Errorf("%q cannot be a fairness id (1-%d visible ASCII characters, no ':' or ',')", name, flowcontrol.MaxFairnessIDBytes)
		}
		return name, nil
	})
}

// tenantMeasured is what one tenant's streams did after the warm-up. Its histograms
// time each turn from its first attempt: a turn retried after 429s is as slow as its
// user saw it, as a request flow control held is.
type tenantMeasured struct {
	completed   atomic.Int64 // turns answered in full
	rateLimited atomic.Int64 // 429s received (each retried)
	// sdkGaveUp counts the turns that got a third 429: an OpenAI SDK with its default
	// max_retries (2) would have raised RateLimitError there; the load test retries on.
	sdkGaveUp     atomic.Int64
	ttft, latency hist

	errMu sync.Mutex
	errs  map[string]int64 // other failures, by class
}

func newTenantMeasured() *tenantMeasured { return &tenantMeasured{errs: map[string]int64{}} }

func (t *tenantMeasured) fail(class string) {
	t.errMu.Lock()
	defer t.errMu.Unlock()
	t.errs[class]++
}

// tenantReport is one tenant's outcome over the measurement.
type tenantReport struct {
	Streams        int     `json:"streams"`
	Requests       int64   `json:"requests"`
	RequestsPerSec float64 `json:"requests_per_second"`
	// RateLimited counts the 429s its streams got, each then retried; SDKGaveUp the
	// turns that got three (an OpenAI SDK's default max_retries, 2, exhausted).
	RateLimited int64            `json:"rate_limited"`
	SDKGaveUp   int64            `json:"turns_past_sdk_retries"`
	Errors      map[string]int64 `json:"errors"` // other failures, by class
	// TTFT and Latency run from a turn's first attempt (retries' waits included).
	TTFT    latency `json:"ttft"`
	Latency latency `json:"request_latency"`
}

// tenantReports summarises each tenant's measurement over secs seconds.
func tenantReports(tenants []tenant, m *measured, secs float64) map[string]tenantReport {
	if len(tenants) == 0 {
		return nil
	}
	out := make(map[string]tenantReport, len(tenants))
	for _, t := range tenants {
		tm := m.tenants[t.key]
		r := tenantReport{Streams: t.streams, Requests: tm.completed.Load(), RateLimited: tm.rateLimited.Load(),
			SDKGaveUp: tm.sdkGaveUp.Load(), Errors: map[string]int64{}, TTFT: summarize(&tm.ttft), Latency: summarize(&tm.latency)}
		if secs > 0 {
			r.RequestsPerSec = float64(r.Requests) / secs
		}
		tm.errMu.Lock()
		for class, n := range tm.errs {
			r.Errors[class] = n
		}
		tm.errMu.Unlock()
		out[t.key] = r
	}
	return out
}

// Retrying a 429 as the OpenAI Go SDK does (openai-go v3, internal/requestconfig's
// retryDelay): the server's retry-after-ms, else retry-after (seconds, or an HTTP
// date), up to 2 minutes; without either, 0.5 s doubling per retry up to 8 s, less up
// to a quarter of it at random so that refused clients do not come back together.
const (
	maxRetryAfter   = 2 * time.Minute
	backoffBase     = 500 * time.Millisecond
	maxBackoff      = 8 * time.Second
	sdkMaxRetries   = 2
	rateLimitStatus = http.StatusTooManyRequests
)

// rateLimitOutcome is kvroute's kvroute_filter_requests_total outcome for a request it
// refused for capacity with a 429 (its OpenAI error code).
const rateLimitOutcome = "rate_limit_exceeded"

// errLoadEnded: the load ended while a turn waited to retry a 429; the turn is
// dropped, which is not a failure.
var errLoadEnded = errors.New("the load ended while the turn waited to retry a 429")

// retryAfter reads the delay a 429 asks for: retry-after-ms, then retry-after in
// seconds or as an HTTP date; ok is false when neither gives one of at most
// maxRetryAfter.
func retryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if v := h.Get("retry-after-ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && ms <= float64(maxRetryAfter/time.Millisecond) {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := h.Get("retry-after")
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s >= 0 && s <= maxRetryAfter.Seconds() {
			return time.Duration(s * float64(time.Second)), true
		}
		return 0, false
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d <= maxRetryAfter {
			return max(d, 0), true
		}
	}
	return 0, false
}

// backoff is the wait before retry number retry (0 first) of a 429 that named no
// delay: 0.5 s × 2^retry up to 8 s, less up to a quarter at random.
func backoff(retry int, rng *rand.Rand) time.Duration {
	d := maxBackoff
	if f := float64(backoffBase) * math.Pow(2, float64(retry)); f < float64(maxBackoff) {
		d = time.Duration(f)
	}
	return d - time.Duration(rng.Int64N(int64(d/4)+1))
}
