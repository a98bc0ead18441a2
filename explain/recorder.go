package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/router"
)

// Entry is one sampled decision.
type Entry struct {
	Time time.Time `json:"time"`
	Trace
}

// Recorder answers explain requests and keeps sampled decisions. Build it with [New].
type Recorder struct {
	cfg Config
	now func() time.Time

	decisions atomic.Uint64 // decisions observed, for sampling

	mu   sync.Mutex
	ring []Entry // len Buffer once full; next is the oldest
	next int
}

// New returns a recorder. now is the clock for entries' times; nil means time.Now.
func New(cfg Config, now func() time.Time) (*Recorder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	cfg.Header = strings.ToLower(cfg.Header)
	return &Recorder{cfg: cfg, now: now, ring: make([]Entry, 0, min(cfg.Buffer, 64))}, nil
}

// Header is the request header that asks for the decision, lower case.
func (r *Recorder) Header() string { return r.cfg.Header }

// Wants reports whether a request whose explain header has value should be answered
// with its decision: explain is enabled and the value is true ("1", "true", …).
func (r *Recorder) Wants(value string) bool {
	want, err := strconv.ParseBool(strings.TrimSpace(value))
	return r.cfg.Enabled && err == nil && want
}

// Observe offers a decision to the sample: one decision in 1/sample_rate is kept, by
// count rather than by chance, so the sample is even and needs no random source.
func (r *Recorder) Observe(d *router.Decision) {
	if r.cfg.SampleRate == 0 {
		return
	}
	n := float64(r.decisions.Add(1))
	if math.Floor(n*r.cfg.SampleRate) == math.Floor((n-1)*r.cfg.SampleRate) {
		return
	}
	e := Entry{Time: r.now(), Trace: Of(d, MaxCandidates)}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ring) < r.cfg.Buffer {
		r.ring = append(r.ring, e)
		return
	}
	r.ring[r.next] = e
	r.next = (r.next + 1) % len(r.ring)
}

// Recent returns up to limit sampled decisions, newest first.
func (r *Recorder) Recent(limit int) []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(limit, len(r.ring))
	out := make([]Entry, 0, max(n, 0))
	for k := 1; k <= n; k++ {
		// The newest is just before next (or at the end while the ring fills).
		i := r.next - k
		if len(r.ring) < r.cfg.Buffer {
			i = len(r.ring) - k
		}
		out = append(out, r.ring[(i+len(r.ring))%len(r.ring)])
	}
	return out
}

// Decisions is the body of GET /decisions.
type Decisions struct {
	SampleRate float64 `json:"sample_rate"`
	Buffer     int     `json:"buffer"`
	Decisions  []Entry `json:"decisions"`
}

// ServeHTTP serves GET /decisions?limit=N: the last N sampled decisions (all kept when
// limit is absent), newest first, as JSON. A limit that is not a positive integer is
// a 400.
func (r *Recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	limit := r.cfg.Buffer
	if s := req.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("limit: must be a positive integer, got %q", s)})
			return
		}
		limit = min(n, r.cfg.Buffer)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	writeDecisions(w, Decisions{SampleRate: r.cfg.SampleRate, Buffer: r.cfg.Buffer, Decisions: r.Recent(limit)})
}

// writeDecisions writes d as a json.Encoder does (a line), an entry at a time: a
// full ring at MaxBuffer is tens of MiB, and encoded whole, every read in progress (a
// slow client, many at once) held a copy of it, and its buffer's growth, until the
// last byte was sent. It stops at the first write that fails.
func writeDecisions(w io.Writer, d Decisions) {
	entries := d.Decisions
	d.Decisions = []Entry{}
	head, _ := json.Marshal(d) // plain types: cannot fail
	head = head[:len(head)-len("]}")]
	for i, e := range entries {
		raw, _ := json.Marshal(e)
		if i > 0 {
			head = append(head, ',')
		}
		if _, err := w.Write(append(head, raw...)); err != nil {
			return
		}
		head = head[:0]
	}
	_, _ = w.Write(append(head, "]}\n"...))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
