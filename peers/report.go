package peers

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// Path is where a replica's admin port serves its [Report].
const Path = "/peers/load"

// Version is the report format's version; a report of another version is refused.
const Version = 1

// Bounds on a report read from a peer. A fleet has far fewer workers; a body beyond
// them is refused whole, not trimmed.
const (
	MaxReportBytes   = 1 << 20
	MaxReportWorkers = 4096
	MaxWorkerName    = 512
	maxReplicaID     = 64
)

// Report is one replica's booked load on every worker it has booked, as served at
// [Path]. Only the counts that sum across replicas are carried: P, N and W.
type Report struct {
	Version int `json:"version"`
	// Replica identifies the process that wrote it (a fresh id each start), so a
	// replica can recognise its own address among its peers and count a peer reached
	// under two addresses once.
	Replica string       `json:"replica"`
	Workers []WorkerLoad `json:"workers"`
}

// WorkerLoad is one worker's counts in a [Report].
type WorkerLoad struct {
	Worker string `json:"worker"`
	// PrefillTokens is P(w): uncached prompt tokens of requests without a first token.
	PrefillTokens int64 `json:"prefill_tokens"`
	// ActiveRequests is N(w); PendingRequests is W(w), those without a first token.
	ActiveRequests  int64 `json:"active_requests"`
	PendingRequests int64 `json:"pending_requests"`
}

// NewReplicaID returns a random replica id.
func NewReplicaID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Ledger is what [Handler] reports: every worker's own booked load (not the peers'),
// and a count of its changes, as scoring.Bookings gives them.
type Ledger interface {
	Loads() map[string]scoring.Load
	Version() uint64
}

// HandlerOptions are how a replica streams its report to the replicas watching it.
type HandlerOptions struct {
	// Interval is the shortest time between two reports of a watch stream: changes
	// within it go out together.
	Interval time.Duration
	// Heartbeat is the longest: an unchanged report is sent again this often, so the
	// watcher can tell a quiet replica from a gone one.
	Heartbeat time.Duration
	// Done ends every watch stream (the admin server shutting down).
	Done <-chan struct{}
	// MaxWatchers bounds the watch streams served at once; more are refused with 503.
	MaxWatchers int
}

// Handler serves this replica's [Report] at GET [Path]: one report, or with ?watch a
// stream of them (newline-delimited JSON), one at once and then one within
// opts.Interval of each change of the ledger, and at least every opts.Heartbeat. It is
// read-only, like /metrics, which shows the same counts.
func Handler(replica string, ledger Ledger, opts HandlerOptions) http.Handler {
	watchers := make(chan struct{}, max(opts.MaxWatchers, 1))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if !r.URL.Query().Has("watch") {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(reportOf(replica, ledger.Loads()))
			return
		}
		select {
		case watchers <- struct{}{}:
			defer func() { <-watchers }()
		default:
			http.Error(w, "too many watchers", http.StatusServiceUnavailable)
			return
		}
		flusher, _ := w.(http.Flusher)
		w.Header().Set("Content-Type", "application/x-ndjson")
		tick := time.NewTicker(opts.Interval)
		defer tick.Stop()
		sent, lastSent := ledger.Version(), time.Now()
		send := func() bool {
			if _, err := w.Write(reportOf(replica, ledger.Loads())); err != nil {
				return false
			}
			if flusher != nil {
				flusher.Flush()
			}
			return true
		}
		if !send() {
			return
		}
		for {
			select {
			case <-r.Context().Done():
				return
			case <-opts.Done:
				return
			case now := <-tick.C:
				// Read the version before the loads: a change after this read is
				// sent at the next tick.
				if v := ledger.Version(); v != sent || now.Sub(lastSent) >= opts.Heartbeat {
					sent, lastSent = v, now
					if !send() {
						return
					}
				}
			}
		}
	})
}

// reportOf encodes a report of the busy workers in loads, as one line.
func reportOf(replica string, loads map[string]scoring.Load) []byte {
	r := Report{Version: Version, Replica: replica, Workers: make([]WorkerLoad, 0, len(loads))}
	for name, l := range loads {
		if l.ActiveRequests == 0 && l.PendingRequests == 0 && l.PrefillTokens == 0 {
			continue // idle: nothing to add, and a peer treats a missing worker as idle
		}
		r.Workers = append(r.Workers, WorkerLoad{Worker: name, PrefillTokens: int64(l.PrefillTokens),
			ActiveRequests: int64(l.ActiveRequests), PendingRequests: int64(l.PendingRequests)})
	}
	slices.SortFunc(r.Workers, func(a, b WorkerLoad) int { return strings.Compare(a.Worker, b.Worker) })
	raw, _ := json.Marshal(r) // plain types: cannot fail
	return append(raw, '\n')
}

// ParseReport reads a peer's report from body, refusing what a replica never writes:
// more than [MaxReportBytes], another version, an empty or long replica id, more than
// [MaxReportWorkers] workers, an empty, long or repeated worker name, a count that is
// negative, fractional or above scoring.MaxPeerCount, unknown trailing data. Unknown
// fields are ignored, so a newer replica may add some.
func ParseReport(body io.Reader) (Report, error) {
	raw, err := io.ReadAll(io.LimitReader(body, MaxReportBytes+1))
	if err != nil {
		return Report{}, fmt.Errorf("read report: %w", err)
	}
	return parseReport(raw)
}

// parseReport is ParseReport of one report's bytes (a line of a watch stream).
func parseReport(raw []byte) (Report, error) {
	if len(raw) > MaxReportBytes {
		return Report{}, fmt.Errorf("report larger than %d bytes", MaxReportBytes)
	}
	var r Report
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&r); err != nil {
		return Report{}, fmt.Errorf("report: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Report{}, errors.New("report: data after the JSON object")
	}
	return r, r.check()
}

func (r Report) check() error {
	switch {
	case r.Version != Version:
		return fmt.Errorf("report: version %d, want %d", r.Version, Version)
	case r.Replica == "" || len(r.Replica) > maxReplicaID:
		return fmt.Errorf("report: replica id must have 1 to %d bytes, got %d", maxReplicaID, len(r.Replica))
	case len(r.Workers) > MaxReportWorkers:
		return fmt.Errorf("report: %d workers, at most %d", len(r.Workers), MaxReportWorkers)
	}
	seen := make(map[string]struct{}, len(r.Workers))
	for i, w := range r.Workers {
		if w.Worker == "" || len(w.Worker) > MaxWorkerName {
			return fmt.Errorf("report: workers[%d]: name must have 1 to %d bytes", i, MaxWorkerName)
		}
		if _, dup := seen[w.Worker]; dup {
			return fmt.Errorf("report: workers[%d]: %q repeated", i, w.Worker)
		}
		seen[w.Worker] = struct{}{}
		for _, c := range []struct {
			key string
			n   int64
		}{{"prefill_tokens", w.PrefillTokens}, {"active_requests", w.ActiveRequests}, {"pending_requests", w.PendingRequests}} {
			if c.n < 0 || c.n > scoring.MaxPeerCount {
				return fmt.Errorf("report: workers[%d].%s: must be in [0, %d], got %d", i, c.key, int64(scoring.MaxPeerCount), c.n)
			}
		}
		if w.PendingRequests > w.ActiveRequests {
			return fmt.Errorf("report: workers[%d]: pending_requests %d above active_requests %d", i, w.PendingRequests, w.ActiveRequests)
		}
	}
	return nil
}
