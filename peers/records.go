package peers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Record is one routing decision's blocks as the replica that made it stored them on
// its worker (router.Deps.RecordBlocks). A replica's index without KV events knows
// only the prompts it placed itself, so with two replicas a session's next turn, sent
// to the other one, finds no holder and moves (docs/BENCHMARKS.md, "Several replicas
// and stale signals"). Reports carry each replica's new records, and the replicas
// watching it store them in their own index as if they had made the decision.
type Record struct {
	Worker string `json:"worker"`
	// Blocks are the decision's chained block hashes, 8 bytes each, little-endian
	// (base64 in the JSON). The hashes depend only on the model, the block size and
	// the tokens, so replicas with one config compute the same ones.
	Blocks []byte `json:"blocks"`
}

// Bounds on the records of one report, read or written. A record is one prompt: 65,536
// blocks are a million tokens in blocks of 16. A report carries at most
// MaxReportBlocks blocks (350 KB of base64, within MaxReportBytes); the records of a
// busier interval than that are dropped oldest first and counted.
const (
	MaxRecordBlocks = 65536
	MaxReportBlocks = 32768
)

// Records holds this replica's decisions' blocks until its next report carries them
// to the replicas watching it. Nothing is kept while no one watches. Its Recorded is
// the router's record sink (router.Deps.Records). Safe for concurrent use.
type Records struct {
	metrics *Metrics
	watched atomic.Bool // a watch stream is open: decisions are kept

	mu      sync.Mutex
	pending []pendingRecord
	blocks  int // in pending
}

// pendingRecord is a decision kept for the next report, encoded when it is taken (off
// the decision's path).
type pendingRecord struct {
	worker string
	blocks []uint64
}

// NewRecords returns an empty Records; m counts the records dropped (nil: not counted).
func NewRecords(m *Metrics) *Records { return &Records{metrics: m} }

// Recorded keeps a decision's blocks on worker for the next report, when someone
// watches. It keeps the slice itself, encoded when a report takes it: the caller must
// not change it (the router's block hashes are fresh for each decision and never
// changed). A record over MaxRecordBlocks is not kept (no peer would accept it).
func (r *Records) Recorded(worker string, blocks []uint64) {
	if r == nil || !r.watched.Load() || len(blocks) == 0 || len(blocks) > MaxRecordBlocks {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(r.pending, pendingRecord{worker: worker, blocks: blocks})
	r.blocks += len(blocks)
	dropped := 0
	for r.blocks > MaxReportBlocks {
		r.blocks -= len(r.pending[dropped].blocks)
		dropped++
	}
	if dropped > 0 {
		r.pending = append(r.pending[:0], r.pending[dropped:]...)
		r.metrics.droppedRecords(dropped)
	}
}

// take returns the records kept since the last take, encoded.
func (r *Records) take() []Record {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	pending := r.pending
	r.pending, r.blocks = nil, 0
	r.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	out := make([]Record, len(pending))
	for i, p := range pending {
		raw := make([]byte, 8*len(p.blocks))
		for j, b := range p.blocks {
			binary.LittleEndian.PutUint64(raw[8*j:], b)
		}
		out[i] = Record{Worker: p.worker, Blocks: raw}
	}
	return out
}

// watch says whether anyone watches; when no one does, the kept records are dropped.
func (r *Records) watch(on bool) {
	if r == nil {
		return
	}
	r.watched.Store(on)
	if !on {
		r.take()
	}
}

// BlockStore is where the peers' records go: the index (index.Index, index.EventIndex).
type BlockStore interface {
	// Store records that worker holds blocks, as a decision of this replica would.
	Store(worker string, blocks []uint64) error
}

// errRecordBlocks is the error of a record whose blocks are not whole hashes.
var errRecordBlocks = errors.New("blocks must be 1 to 65,536 hashes of 8 bytes")

// checkRecords bounds a report's records: how many blocks in all, and per record; the
// worker's name as for loads.
func checkRecords(records []Record) error {
	total := 0
	for i, rec := range records {
		if rec.Worker == "" || len(rec.Worker) > MaxWorkerName {
			return fmt.Errorf("report: records[%d]: worker name must have 1 to %d bytes", i, MaxWorkerName)
		}
		n := len(rec.Blocks) / 8
		if len(rec.Blocks)%8 != 0 || n == 0 || n > MaxRecordBlocks {
			return fmt.Errorf("report: records[%d]: %w, got %d bytes", i, errRecordBlocks, len(rec.Blocks))
		}
		if total += n; total > MaxReportBlocks {
			return fmt.Errorf("report: records: more than %d blocks", MaxReportBlocks)
		}
	}
	return nil
}

// hashes decodes a checked record's blocks.
func (rec Record) hashes() []uint64 {
	out := make([]uint64, len(rec.Blocks)/8)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(rec.Blocks[8*i:])
	}
	return out
}
