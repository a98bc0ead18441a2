package replay

import (
	"encoding/json"
	"io"
	"time"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/sim"
)

// The request log (Config.Log) says, request by request, why a run's numbers are what
// they are: which turn recomputed more than it had to and whose pass evicted its
// blocks, and what each pass computed while a request waited for its first token. One
// JSON object per line, with a "kind" of "request", "pass" or "evict"; times are in
// virtual milliseconds.

// RequestLine is one finished request.
type RequestLine struct {
	Kind    string `json:"kind"` // "request"
	ID      int    `json:"id"`
	Session int    `json:"session"` // -1: none
	Turn    int    `json:"turn"`
	Worker  int    `json:"worker"` // the chosen worker's index: w0, w1, …
	// PrevWorker is the worker of the session's previous turn (-1: none): the turn
	// moved when it differs from Worker.
	PrevWorker int `json:"prev_worker"`
	// Arrival, Admitted (the start of the pass that first admitted it), FirstToken.
	ArrivalMs    float64 `json:"arrival_ms"`
	AdmittedMs   float64 `json:"admitted_ms"`
	FirstTokenMs float64 `json:"first_token_ms"`
	TTFTMs       float64 `json:"ttft_ms"`
	Prompt       int     `json:"prompt"`
	// Predicted are the cached tokens the decision expected (the chosen worker's
	// overlap in the index); Cached what the engine served at admission.
	Predicted  int `json:"predicted"`
	Cached     int `json:"cached"`
	Recomputed int `json:"recomputed"`
	// Floor is what any router must compute for the turn: for a resumed turn, the
	// tokens its previous turn did not leave in full cached blocks; for a first turn
	// or a request without a session, the whole prompt (more than the floor when
	// sessions share a prefix: the log does not know who shares what).
	Floor       int `json:"floor"`
	Preempted   int `json:"preempted"`
	Preemptions int `json:"preemptions"`
	// Candidates are the decision's cost terms, one per candidate worker in order.
	Candidates []CandidateLine `json:"candidates"`
}

// CandidateLine is one candidate's cost at the decision, in blocks (scoring.Terms).
type CandidateLine struct {
	Cost     float64 `json:"cost"`
	Overlap  int     `json:"overlap"`
	Prefill  float64 `json:"prefill"`
	Load     int     `json:"load"` // D + new: distinct active blocks with the request's
	Affinity float64 `json:"affinity"`
	Pressure float64 `json:"pressure"`
	Queue    float64 `json:"queue"`
	// Interference is ι·N(w)·missing (scoring.Terms.Interference).
	Interference float64 `json:"interference"`
	// History is ω·H(w)/bs, the worker's recent prefill (scoring.Terms.History); left
	// out while prefill_history_weight is 0.
	History  float64 `json:"history,omitempty"`
	Requests float64 `json:"requests"`
	Session  float64 `json:"session"`
	// Held is the worker's footprint in the index, in blocks.
	Held int `json:"held"`
}

// PassLine is one engine pass.
type PassLine struct {
	Kind          string  `json:"kind"` // "pass"
	Worker        int     `json:"worker"`
	StartMs       float64 `json:"start_ms"`
	EndMs         float64 `json:"end_ms"`
	PrefillTokens int     `json:"prefill_tokens"`
	// Prefills are the requests computing prompt tokens in the pass, by id, with their
	// tokens; Decodes counts the requests decoding one token.
	Prefills []PrefillChunk `json:"prefills"`
	Decodes  int            `json:"decodes"`
	// KVUsage is the share of the engine's blocks held by running requests at the end.
	KVUsage float64 `json:"kv_usage"`
}

// PrefillChunk is one request's prompt tokens computed in a pass.
type PrefillChunk struct {
	ID     int `json:"id"`
	Tokens int `json:"tokens"`
}

// EvictLine is a run of one session's blocks an engine evicted from its prefix cache
// to make room during a pass.
type EvictLine struct {
	Kind   string  `json:"kind"` // "evict"
	AtMs   float64 `json:"at_ms"`
	Worker int     `json:"worker"`
	// Session owns the blocks (-1: a request without a session, or unknown).
	Session int `json:"session"`
	// State is the session's state when its blocks went: "running" (a turn in flight),
	// "paused" (between turns), "finished" (no turn left) or "" without a session.
	State string `json:"state"`
	// Blocks evicted, and the shallowest one's position in the session's sequence.
	Blocks    int `json:"blocks"`
	FromBlock int `json:"from_block"`
	// By are the requests computing prompt tokens in the pass, whose new blocks are
	// most of what it allocated (its decodes, which take a block every block_size
	// tokens, are not listed).
	By []int `json:"by"`
}

// logger writes a run's request log. It is nil when the run has no log.
type logger struct {
	enc      *json.Encoder
	bs       int
	salt     uint64
	owner    map[uint64]blockOwner
	lastSeq  map[int][]uint32 // session → its last finished turn's prompt and output
	lastW    map[int]int      // session → the worker of its last routed turn
	running  map[int]int      // session → turns in flight
	finished map[int]bool     // session → no turn left
	starts   []time.Duration
	// atStart are the sessions with a turn in flight when each worker's pass started,
	// when its evictions happened.
	atStart []map[int]bool
	err     error
}

type blockOwner struct{ session, block int }

func newLogger(w io.Writer, engine sim.Config, salt uint64, workers int) *logger {
	if w == nil {
		return nil
	}
	return &logger{enc: json.NewEncoder(w), bs: engine.BlockSize, salt: salt, owner: map[uint64]blockOwner{},
		lastSeq: map[int][]uint32{}, lastW: map[int]int{}, running: map[int]int{}, finished: map[int]bool{},
		starts: make([]time.Duration, workers), atStart: make([]map[int]bool, workers)}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (l *logger) write(v any) {
	if l.err == nil {
		l.err = l.enc.Encode(v)
	}
}

// routed notes a session request's decision: its blocks' owner, and the session's
// previous worker (returned; -1 for none). Blocks of requests without a session are not
// kept (a trace's would be millions): their evictions log session -1.
func (l *logger) routed(r *Req, worker int) (prev int) {
	prev = -1
	if r.Session >= 0 {
		seq := append(append(make([]uint32, 0, len(r.Prompt)+len(r.Output)), r.Prompt...), r.Output...)
		for i, h := range index.BlockHashes(nil, seq, l.bs, l.salt) {
			if _, ok := l.owner[h]; !ok {
				l.owner[h] = blockOwner{session: r.Session, block: i}
			}
		}
		if w, ok := l.lastW[r.Session]; ok {
			prev = w
		}
		l.lastW[r.Session] = worker
		l.running[r.Session]++
	}
	return prev
}

func (l *logger) passStarted(worker int, at time.Duration) {
	l.starts[worker] = at
	running := map[int]bool{}
	for s, n := range l.running {
		if n > 0 {
			running[s] = true
		}
	}
	l.atStart[worker] = running
}

// passEnded logs a pass and the blocks it evicted, by owning session.
func (l *logger) passEnded(worker int, now time.Duration, e *sim.Engine, events []sim.Event) {
	pass := PassLine{Kind: "pass", Worker: worker, StartMs: ms(l.starts[worker]), EndMs: ms(now), KVUsage: e.KVUsage()}
	var by []int
	for _, c := range e.Pass() {
		if c.Decode {
			pass.Decodes++
			continue
		}
		pass.PrefillTokens += c.Tokens
		pass.Prefills = append(pass.Prefills, PrefillChunk{ID: c.Request.ID, Tokens: c.Tokens})
		by = append(by, c.Request.ID)
	}
	l.write(pass)
	for _, ev := range events {
		if ev.Stored || ev.Host {
			continue // the log's evictions are the device's (a host copy may remain)
		}
		var cur *EvictLine
		for _, h := range ev.Hashes {
			o, ok := l.owner[h]
			if !ok {
				o = blockOwner{session: -1, block: -1}
			}
			if cur == nil || cur.Session != o.session {
				if cur != nil {
					l.write(cur)
				}
				cur = &EvictLine{Kind: "evict", AtMs: ms(l.starts[worker]), Worker: worker, Session: o.session,
					State: l.state(worker, o.session), FromBlock: o.block, By: by}
			}
			cur.Blocks++
			cur.FromBlock = min(cur.FromBlock, o.block)
		}
		if cur != nil {
			l.write(cur)
		}
	}
}

// state is a session's state when the worker's pass started.
func (l *logger) state(worker, session int) string {
	switch {
	case session < 0:
		return ""
	case l.atStart[worker][session]:
		return "running"
	case l.finished[session]:
		return "finished"
	}
	return "paused"
}

// done logs a finished request; more reports whether its session has a turn left.
func (l *logger) done(f *flight, sr *sim.Request, more bool) {
	r := f.req
	line := RequestLine{Kind: "request", ID: r.ID, Session: r.Session, Turn: r.Turn, Worker: f.worker, PrevWorker: f.prev,
		ArrivalMs: ms(f.arrival), AdmittedMs: ms(sr.AdmittedAt), FirstTokenMs: ms(f.first), TTFTMs: ms(f.first - f.arrival),
		Prompt: len(r.Prompt), Predicted: f.decision.PredictedCachedTokens, Cached: sr.CachedTokens,
		Recomputed: sr.RecomputedTokens, Floor: len(r.Prompt), Preempted: sr.PreemptedTokens, Preemptions: sr.Preemptions}
	for _, t := range f.decision.Terms {
		line.Candidates = append(line.Candidates, CandidateLine{Cost: t.Cost, Overlap: t.Overlap, Prefill: t.Prefill,
			Load: t.ActiveBlocks + t.NewBlocks, Affinity: t.Affinity, Pressure: t.Pressure, Queue: t.Queue, Interference: t.Interference, History: t.History,
			Requests: t.Requests, Session: t.Session, Held: t.HeldBlocks})
	}
	if r.Session >= 0 {
		if prev, ok := l.lastSeq[r.Session]; ok && r.Turn > 1 {
			// The previous turn computed its prompt and all but its last output token;
			// of those, the ones this prompt starts with can be cached (none when the
			// session compacted its history into a fresh summary).
			computed := prev[:len(prev)-1]
			shared := 0
			for shared < min(len(computed), len(r.Prompt)) && computed[shared] == r.Prompt[shared] {
				shared++
			}
			cacheable := min(shared/l.bs, (len(r.Prompt)-1)/l.bs) * l.bs
			line.Floor = len(r.Prompt) - cacheable
		}
		l.lastSeq[r.Session] = append(append(l.lastSeq[r.Session][:0], r.Prompt...), r.Output...)
		l.running[r.Session]--
		l.finished[r.Session] = !more
	}
	l.write(line)
}
