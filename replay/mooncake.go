package replay

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/zeebo/xxh3"
)

// TraceConfig controls how a Mooncake trace is replayed.
type TraceConfig struct {
	// Speedup divides the trace's timestamps.
	Speedup float64
	// Jitter adds a seeded uniform delay in [0, Jitter) to each arrival: the
	// conversation trace's timestamps are quantised to about 3 s.
	Jitter time.Duration
	// MaxRequests keeps the first N rows; 0 keeps all.
	MaxRequests int
}

// traceBlockTokens is the Mooncake traces' block size: one hash id per 512 tokens.
const traceBlockTokens = 512

type traceRow struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
	SessionID    *string  `json:"session_id"`
}

// trace is an open-loop workload read from a Mooncake JSONL trace.
type trace struct{ arrivals []Arrival }

// NewTrace reads a Mooncake JSONL trace. A line that is not a valid row is an error
// naming its line number. Prompt tokens are derived from (hash id, position) so equal
// ids give equal blocks; output tokens are seeded and unique.
func NewTrace(r io.Reader, cfg TraceConfig, seed uint64) (Workload, error) {
	if cfg.Speedup <= 0 {
		return nil, fmt.Errorf("speedup: must be > 0, got %v", cfg.Speedup)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	sessions := map[string]int{}
	turns := map[int]int{}
	var out []Arrival
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		if cfg.MaxRequests > 0 && len(out) >= cfg.MaxRequests {
			break
		}
		var row traceRow
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return nil, fmt.Errorf("trace line %d: %v", line, err)
		}
		switch {
		case row.Timestamp == nil || *row.Timestamp < 0:
			return nil, fmt.Errorf("trace line %d: timestamp is required and must be ≥ 0", line)
		case row.InputLength == nil || *row.InputLength <= 0:
			return nil, fmt.Errorf("trace line %d: input_length is required and must be > 0", line)
		case row.OutputLength == nil || *row.OutputLength <= 0:
			return nil, fmt.Errorf("trace line %d: output_length is required and must be > 0", line)
		case len(row.HashIDs)*traceBlockTokens < *row.InputLength:
			return nil, fmt.Errorf("trace line %d: %d hash_ids cannot cover input_length %d", line, len(row.HashIDs), *row.InputLength)
		}
		at := time.Duration(*row.Timestamp / cfg.Speedup * float64(time.Millisecond))
		if cfg.Jitter > 0 {
			at += time.Duration(rng.Int64N(int64(cfg.Jitter)))
		}
		req := &Req{ID: len(out), Session: -1, Prompt: expand(row.HashIDs, *row.InputLength), Output: tokens(rng, *row.OutputLength)}
		if row.SessionID != nil {
			id, ok := sessions[*row.SessionID]
			if !ok {
				id = len(sessions)
				sessions[*row.SessionID] = id
			}
			turns[id]++
			req.Session, req.Turn = id, turns[id]
		}
		out = append(out, Arrival{At: at, Req: req})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return &trace{arrivals: out}, nil
}

// expand turns 512-token block ids into tokens, truncated to n.
func expand(ids []int64, n int) []uint32 {
	out := make([]uint32, 0, n)
	var buf [16]byte
	for _, id := range ids {
		for j := 0; j < traceBlockTokens && len(out) < n; j++ {
			binary.LittleEndian.PutUint64(buf[:8], uint64(id))
			binary.LittleEndian.PutUint64(buf[8:], uint64(j))
			out = append(out, uint32(xxh3.Hash(buf[:])%150_000))
		}
	}
	return out
}

func (t *trace) Start() []Arrival                        { return t.arrivals }
func (t *trace) Completed(*Req, time.Duration) []Arrival { return nil }
