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

// Loads is what [Handler] reports: every worker's own booked load (not the peers'),
// as scoring.Bookings.Loads returns it.
type Loads interface {
	Loads() map[string]scoring.Load
}

// Handler serves this replica's [Report] at GET [Path]. It is read-only, like
// /metrics, which shows the same counts.
func Handler(replica string, ledger Loads) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		loads := ledger.Loads()
		r := Report{Version: Version, Replica: replica, Workers: make([]WorkerLoad, 0, len(loads))}
		for name, l := range loads {
			if l.ActiveRequests == 0 && l.PendingRequests == 0 && l.PrefillTokens == 0 {
				continue // idle: nothing to add, and a peer treats a missing worker as idle
			}
			r.Workers = append(r.Workers, WorkerLoad{Worker: name, PrefillTokens: int64(l.PrefillTokens),
				ActiveRequests: int64(l.ActiveRequests), PendingRequests: int64(l.PendingRequests)})
		}
		slices.SortFunc(r.Workers, func(a, b WorkerLoad) int { return strings.Compare(a.Worker, b.Worker) })
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(r)
	})
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
