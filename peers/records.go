package peers

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/session"
)

// Record is one routing decision's blocks as the replica that made it stored them on
// its worker (router.Deps.RecordBlocks). A replica's index without KV events knows
// only the prompts it placed itself, so with two replicas a session's next turn, sent
// to the other one, finds no holder and moves (docs/BENCHMARKS.md, "Several replicas
// and stale signals"). Reports carry each replica's records, and the replicas
// watching it store them in their own index as if they had made the decision.
type Record struct {
	Worker string `json:"worker"`
	// Address is the worker's address when the decision was made: a watcher that has
	// seen the worker move since (a pod restarted at a new address under its name, its
	// index cleared) does not credit the new engine with the old one's blocks. Empty
	// from replicas before it was sent (their records are stored whatever).
	Address string `json:"address,omitempty"`
	// Blocks are the decision's chained block hashes, 8 bytes each, little-endian
	// (base64 in the JSON). The hashes depend only on the model, the block size and
	// the tokens, so replicas with one config compute the same ones. Empty only in a
	// record of a session alone (a request without a prompt).
	Blocks []byte `json:"blocks"`
	// Session, when not 0, is the key (session.Key) of the request's session id (the
	// session header's value): the watching replicas remember the worker as the
	// session's last, as the replica that routed it does. The id itself, which a
	// client chose, is not sent.
	Session uint64 `json:"session,omitempty"`
	// Response, when set, makes Session the key (session.ResponseKey) of a Responses
	// API response the worker's engine stored, in a record without blocks: the
	// watching replicas send requests naming it there. A replica before it takes the
	// key for a session's, which no session header can name: it costs that replica a
	// session entry, never a wrong pin.
	Response bool `json:"response,omitempty"`
}

// Bounds on records, written or read.
const (
	// MaxRecordBlocks bounds one record: a longer prompt's record carries its first
	// MaxRecordBlocks blocks (a prefix of chained hashes is a valid record; 32,768
	// blocks are half a million tokens in blocks of 16).
	MaxRecordBlocks = 32768
	// MaxReportRecordBytes bounds the encoded records of one report line. Records
	// beyond it, or beyond what the line's loads leave of MaxReportBytes
	// (recordBytes), go in further lines.
	MaxReportRecordBytes = 512 << 10
	// MaxRecordAddress bounds a record's address: an ip:port is at most 47 bytes
	// ([v6 with a zone]:port fits too).
	MaxRecordAddress = 256
	// maxPendingBlocks bounds the decisions kept between two reports (a busier
	// peers.interval drops the oldest, counted).
	maxPendingBlocks = 65536
	// maxSealedBytes bounds the encoded records kept for watchers that lag or reopen
	// their stream (they resume from the last one they got).
	maxSealedBytes = 4 << 20
	// recordGrace is how long records are still kept after the last watcher left, so
	// that a stream renewed (every minute) or reopened after an error resumes without
	// a gap: longer than the watcher's longest back-off.
	recordGrace = 5 * time.Second
)

// Records holds this replica's decisions' blocks for the replicas watching it: kept
// when decided (Recorded, the router's record sink: router.Deps.Records), encoded once
// for every watcher at the next report (seal), and kept, numbered, up to
// maxSealedBytes, so that each watch stream sends each record once, in order, from
// where it stands, and a watcher that reopens its stream resumes where it was.
// Nothing is kept while no one watches (after a grace for renewals). Safe for
// concurrent use.
type Records struct {
	metrics *Metrics
	watched atomic.Bool // a watch stream is open, or was within recordGrace

	mu       sync.Mutex
	watchers int
	grace    *time.Timer // forgets everything recordGrace after the last watcher left
	pending  []pendingRecord
	spare    []pendingRecord // the last sealed batch's array, kept for the next batch
	blocks   int             // in pending
	sealed   []sealedRecord
	bytes    int    // in sealed
	next     uint64 // the number the next sealed record gets; 1 is the first
}

// pendingRecord is a decision kept for the next report, encoded when sealed (off the
// decision's path).
type pendingRecord struct {
	worker  string
	address string
	blocks  []uint64
	session uint64 // session.Key of the id, 0 without: the id itself is not kept
	// response: session is the key of a stored response (Record.Response).
	response bool
}

// sealedRecord is a record encoded as a JSON object, with its number.
type sealedRecord struct {
	seq uint64
	raw []byte
	at  time.Time // when sealed: within peers.interval of the decision
}

// NewRecords returns an empty Records; m counts the records dropped (nil: not counted).
func NewRecords(m *Metrics) *Records { return &Records{metrics: m, next: 1} }

// Recorded keeps a decision's blocks on worker at address, and its session id ("" without one),
// for the next report, when someone watches. It keeps the slice itself, encoded when
// sealed: the caller must not change it (the router's block hashes are fresh for each
// decision and never changed). It is called under the router's decision lock: it only
// appends.
func (r *Records) Recorded(worker, address string, blocks []uint64, sessionID string) {
	if r == nil || !r.watched.Load() || (len(blocks) == 0 && sessionID == "") {
		return
	}
	blocks = blocks[:min(len(blocks), MaxRecordBlocks)]
	var key uint64
	if sessionID != "" {
		key = session.Key(sessionID)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(r.pending, pendingRecord{worker: worker, address: address, blocks: blocks, session: key})
	// A record of a session alone counts as one block: the bound holds for them too.
	r.blocks += max(1, len(blocks))
	r.dropOverflow()
}

// RecordedResponse keeps a Responses API response that worker at address stored, by its
// key (session.ResponseKey), for the next report, when someone watches. Bounded with
// the decisions' records, each counting as one block.
func (r *Records) RecordedResponse(worker, address string, key uint64) {
	if r == nil || !r.watched.Load() || key == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(r.pending, pendingRecord{worker: worker, address: address, session: key, response: true})
	r.blocks++
	r.dropOverflow()
}

// dropOverflow drops the oldest pending records past maxPendingBlocks, counted. r.mu
// is held.
func (r *Records) dropOverflow() {
	dropped := 0
	for r.blocks > maxPendingBlocks {
		r.blocks -= max(1, len(r.pending[dropped].blocks))
		dropped++
	}
	if dropped > 0 {
		clear(r.pending[:dropped]) // let their blocks go
		r.pending = r.pending[dropped:]
		r.metrics.droppedRecords(dropped)
	}
}

// seal encodes the records kept since the last seal and numbers them, forgetting the
// oldest sealed ones past maxSealedBytes; it returns the number of the newest sealed
// record (0: none yet). One caller at a time (the publisher, under its lock).
func (r *Records) seal() uint64 {
	if r == nil {
		return 0
	}
	pending := r.take()
	raws := make([][]byte, len(pending))
	for i, p := range pending {
		raw := make([]byte, 8*len(p.blocks))
		for j, b := range p.blocks {
			binary.LittleEndian.PutUint64(raw[8*j:], b)
		}
		rec := Record{Worker: p.worker, Address: p.address, Blocks: raw, Session: p.session, Response: p.response}
		raws[i], _ = json.Marshal(rec) // plain types: cannot fail
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recycle(pending)
	for _, raw := range raws {
		r.sealed = append(r.sealed, sealedRecord{seq: r.next, raw: raw, at: now})
		r.next++
		r.bytes += len(raw)
	}
	forget := 0
	for r.bytes > maxSealedBytes {
		r.bytes -= len(r.sealed[forget].raw)
		forget++
	}
	if forget > 0 {
		clear(r.sealed[:forget])
		r.sealed = r.sealed[forget:]
	}
	return r.next - 1
}

// take hands over the records kept since the last seal. The next batch fills the
// array of the one before (recycle): Recorded, under the decision lock, then appends
// without growing a fresh slice after every report.
func (r *Records) take() []pendingRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	pending := r.pending
	r.pending, r.spare, r.blocks = r.spare[:0], nil, 0
	return pending
}

// recycle keeps a taken batch's array for the next one, letting its blocks go. r.mu is
// held.
func (r *Records) recycle(pending []pendingRecord) {
	clear(pending)
	r.spare = pending[:0]
}

// newest returns the number of the newest sealed record (0: none yet).
func (r *Records) newest() uint64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.next - 1
}

// sinceWithin returns the sealed records numbered after after and at most upTo, as
// many as fit in maxBytes (at least one), the number of the first and when it was
// sealed. Records numbered after after that were forgotten before it could have them
// are counted as dropped: the stream asking could not send them.
func (r *Records) sinceWithin(after, upTo uint64, maxBytes int) (raws [][]byte, first uint64, sealed time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	upTo = min(upTo, r.next-1)
	if len(r.sealed) == 0 || after >= upTo {
		return nil, 0, time.Time{}
	}
	oldest := r.sealed[0].seq
	if after+1 < oldest {
		r.metrics.droppedRecords(int(oldest - after - 1))
		after = oldest - 1
	}
	sealed = r.sealed[after+1-oldest].at
	bytes := 0
	for _, s := range r.sealed[after+1-oldest:] {
		if s.seq > upTo || (len(raws) > 0 && bytes+len(s.raw) > maxBytes) {
			break
		}
		raws = append(raws, s.raw)
		bytes += len(s.raw) + 1
	}
	return raws, after + 1, sealed
}

// join counts a watch stream: records are kept from now on (and what was kept for a
// stream that left within recordGrace stays).
func (r *Records) join() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchers++
	if r.grace != nil {
		r.grace.Stop()
		r.grace = nil
	}
	r.watched.Store(true)
}

// leave uncounts a watch stream; recordGrace after the last one leaves, if none has
// joined since, nothing is kept any more.
func (r *Records) leave() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watchers--; r.watchers > 0 {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(recordGrace, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.grace != t { // a watcher joined (and maybe left) since
			return
		}
		r.grace = nil
		r.watched.Store(false)
		clear(r.pending)
		clear(r.sealed)
		r.pending, r.spare, r.blocks, r.sealed, r.bytes = nil, nil, 0, nil, 0
	})
	r.grace = t
}

// BlockStore is where the peers' records go: the router's index (*router.Router).
type BlockStore interface {
	// StoreRecord records that worker, at address ("" when the peer did not say),
	// holds blocks, as a decision of this replica would; moved when the worker has
	// left that address since, and nothing is stored. An error is a worker this
	// replica does not know.
	StoreRecord(worker, address string, blocks []uint64) (moved bool, err error)
}

// SessionStore is where the sessions of the peers' records go (*session.Store).
type SessionStore interface {
	// RememberKey records that worker served the session (by its key) last.
	RememberKey(key uint64, worker string)
}

// errRecordBlocks is the error of a record whose blocks are not whole hashes.
var errRecordBlocks = errors.New("blocks must be 1 to 32,768 hashes of 8 bytes (0 with a session)")

// maxBlockSize bounds a report's block_size: no engine has larger blocks.
const maxBlockSize = 1 << 16

// checkRecords bounds a report's records: the numbering and block size they come with,
// the worker's name as for loads, whole hashes, MaxRecordBlocks per record. The
// report's size bounds their count.
func (r Report) checkRecords() error {
	if len(r.Records) == 0 {
		return nil
	}
	switch {
	case r.RecordsFrom == 0:
		return errors.New("report: records without records_from")
	case r.BlockSize < 1 || r.BlockSize > maxBlockSize:
		return fmt.Errorf("report: records with block_size %d, want 1 to %d", r.BlockSize, maxBlockSize)
	case r.RecordsAgeMs < 0:
		return fmt.Errorf("report: records_age_ms %d, want ≥ 0", r.RecordsAgeMs)
	}
	for i, rec := range r.Records {
		if rec.Worker == "" || len(rec.Worker) > MaxWorkerName {
			return fmt.Errorf("report: records[%d]: worker name must have 1 to %d bytes", i, MaxWorkerName)
		}
		if len(rec.Address) > MaxRecordAddress {
			return fmt.Errorf("report: records[%d]: address over %d bytes", i, MaxRecordAddress)
		}
		n := len(rec.Blocks) / 8
		if len(rec.Blocks)%8 != 0 || (n == 0 && rec.Session == 0) || n > MaxRecordBlocks {
			return fmt.Errorf("report: records[%d]: %w, got %d bytes", i, errRecordBlocks, len(rec.Blocks))
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

// recordBytes is how many bytes of records a line may carry beside plain, a report
// line: what MaxReportBytes leaves, less what withRecords adds around the records, and
// at most MaxReportRecordBytes. A line past MaxReportBytes is refused by every peer,
// and a stream reopened resumes with the same records.
func recordBytes(plain []byte) int {
	const around = 128 // ,"block_size":…,"records_from":…,"records_age_ms":…,"records":[…]
	return min(MaxReportRecordBytes, MaxReportBytes-len(plain)-around)
}

// withRecords is a report line (plain: a JSON object and a newline) with records
// spliced in: their numbering from first, the block size their hashes were made with,
// how long ago the first was sealed (on this replica's clock; 0 is left out), and the
// records themselves (encoded JSON objects).
func withRecords(plain []byte, blockSize int, first uint64, age time.Duration, raws [][]byte) []byte {
	size := len(plain) + 64
	for _, raw := range raws {
		size += len(raw) + 1
	}
	out := make([]byte, 0, size)
	out = append(out, plain[:len(plain)-2]...) // without "}\n"
	out = fmt.Appendf(out, `,"block_size":%d,"records_from":%d,`, blockSize, first)
	if ms := age.Milliseconds(); ms > 0 {
		out = fmt.Appendf(out, `"records_age_ms":%d,`, ms)
	}
	out = append(out, `"records":[`...)
	for i, raw := range raws {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, raw...)
	}
	return append(out, "]}\n"...)
}
