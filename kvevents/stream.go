package kvevents

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"time"
)

// replayFunc asks a publisher for its buffered batches from seq from on, calling each
// for every one in order; it returns when the end marker arrives, or the error that
// ended the replay.
type replayFunc func(ctx context.Context, from uint64, each func(Message)) error

// dupWindow is how far behind the last sequence number a message may be and still be
// taken for a duplicate (a live message the replay already delivered) rather than a
// restarted publisher, unless the stream reconnected or paused in between.
const dupWindow = 64

// restartPause is how long a pause before a message with an old sequence number makes
// it a restart rather than a duplicate.
const restartPause = 2 * time.Second

// replayAhead is how far past the live message that asked for a replay a replayed
// batch may be numbered: the engine replays what it buffers (10,000 batches, vLLM's
// and SGLang's default), the batches it published after that message included. One
// numbered further is refused: taken as the last batch, it made the stream drop every
// live batch after it as one a replay had already delivered.
const replayAhead = 10_000

// stream checks one rank's sequence numbers and applies its batches (KV_EVENTS.md
// "semantics the consumer must respect"): the next number is applied; a jump is a gap,
// replayed from the first missing batch when the engine has a replay endpoint, else
// the rank's entries are cleared and rebuilt from what comes next; a number at or
// below the last one but above the last live message's, on the same connection, is a
// batch a replay delivered ahead of the live stream, dropped; otherwise a number at or
// below the last one after a reconnection, a pause, or a drop of more than dupWindow
// is a restarted publisher, whose rank is cleared (and replayed from 0 when possible);
// a recent one is a duplicate and dropped. The first number past the last one after a
// reconnection is checked against the engine's replay first ([stream.rejoin]). A
// replayed batch numbered more than replayAhead past the live message that asked for
// the replay is refused. A stream is driven by one goroutine.
type stream struct {
	a       *Applier
	rank    int
	replay  replayFunc // nil: the engine has no replay endpoint
	now     func() time.Time
	metrics *Metrics
	log     *slog.Logger

	started     bool // a batch of the current publisher process was applied
	last        uint64
	lastSum     uint64       // fingerprint of batch last's payload, kept when there is a replay endpoint
	seed        maphash.Seed // of the fingerprints; set at the first
	lastAt      time.Time
	reconnected bool   // the connection was re-established since the last message
	live        uint64 // the last live message's seq (last can be ahead of it, by replay)
}

// onMessage handles one live message.
func (s *stream) onMessage(ctx context.Context, m Message) {
	if m.Seq == endSeq {
		// The replay end marker's number, never a batch's: taken for one, last+1 would
		// wrap to 0 and every later batch look like a gap.
		s.metrics.decodeError(s.a.spec.Name)
		s.log.Warn("kv events: live message numbered like the replay end marker; dropped", "rank", s.rank)
		return
	}
	now := s.now()
	defer func() { s.lastAt, s.reconnected, s.live = now, false, m.Seq }()
	if !s.started {
		s.first(ctx, m)
		return
	}
	switch {
	case m.Seq > s.last && s.reconnected && s.replay != nil:
		s.rejoin(ctx, m)
	case m.Seq == s.last+1:
		s.apply(m)
	case m.Seq > s.last+1:
		s.metrics.gap(s.a.spec.Name)
		s.log.Warn("kv events: sequence gap", "rank", s.rank, "last", s.last, "got", m.Seq)
		s.resync(ctx, s.last+1, reasonGap, m)
	case m.Seq > s.live && !s.reconnected:
		// The live stream catching up with batches a replay already delivered (the
		// engine replays what it published after the live message that caused the
		// replay too): duplicates, however many or however long the replay took.
	case m.Seq == 0 || s.reconnected || s.last-m.Seq > dupWindow || now.Sub(s.lastAt) > restartPause:
		s.log.Warn("kv events: publisher restarted", "rank", s.rank, "last", s.last, "got", m.Seq)
		s.a.resetRank(s.rank, reasonRestart)
		s.started = false
		s.first(ctx, m)
	default:
		// A batch already applied (the replay delivered it too).
	}
}

// first handles the first message of a publisher process: from its start (seq 0),
// or, having joined later, after replaying what the engine still buffers.
func (s *stream) first(ctx context.Context, m Message) {
	if m.Seq == 0 || s.replay == nil {
		s.started = true
		s.apply(m)
		return
	}
	s.resync(ctx, 0, reasonGap, m)
}

// resync replays from seq from, then applies m if the replay did not already. A replay
// that fails, or that skips a batch (the engine no longer buffers the batch at from, or
// the replay lost one on the way), clears the rank before what follows the hole: what
// was missed may have removed blocks.
func (s *stream) resync(ctx context.Context, from uint64, reason string, m Message) {
	if s.replay == nil {
		s.a.resetRank(s.rank, reason)
		s.started = true
		s.apply(m)
		return
	}
	cleared := false
	err := s.replay(ctx, from, func(r Message) { cleared = s.take(r, reason, m.Seq) || cleared })
	s.settle(err, cleared, from, reason, m)
}

// rejoin handles m, the first message after a (re)connection, numbered past the last
// batch applied, when the engine has a replay endpoint: it replays from the last batch
// applied and takes the stream for the same publisher process only if that batch
// comes back first and unchanged; otherwise the rank is cleared and replayed from 0.
//
// A restarted engine numbers its batches from 0 again, but by the time kvroute hears
// from it (a redial after back-off; an engine that dials a bound endpoint anew) it may
// have published more than kvroute had seen, and its first message then reads as a
// gap. Replayed from last+1, the new process's batches were applied over the old
// process's entries, whose blocks the new process never holds nor removes: the index
// reported cache the engine no longer has, which sends requests where nothing is
// cached, the worse way to be wrong. Sequence numbers cannot tell the two apart, and
// the connection only says when one is possible: a restart ends the connection, but
// so does a network fault. The batch at last can: an engine replays the very payload
// it published (vLLM and SGLang buffer the packed bytes), and each payload carries
// the engine's clock, so the batch a new process numbers alike differs. A replay that
// no longer has the batch (an engine buffers 10,000; an older start silently starts
// at the oldest it has), or that fails, cannot vouch for the old entries, which are
// then cleared: the worker is under-reported until its events rebuild it (a prefix it
// never stores again stays unknown), which costs some cache hits, where over-reporting
// costs the request's latency.
func (s *stream) rejoin(ctx context.Context, m Message) {
	from, sum := s.last, s.lastSum
	seen, same, cleared := false, false, false
	err := s.replay(ctx, from, func(r Message) {
		if !seen {
			seen = true
			same = r.Seq == from && s.fingerprint(r.Payload) == sum
		}
		if same {
			cleared = s.take(r, reasonGap, m.Seq) || cleared
		}
	})
	switch {
	case same:
		if m.Seq > from+1 {
			s.metrics.gap(s.a.spec.Name)
			s.log.Warn("kv events: sequence gap after a reconnection", "rank", s.rank, "last", from, "got", m.Seq)
		}
		s.settle(err, cleared, from, reasonGap, m)
	case !seen && err != nil:
		// Nothing to vouch for the entries, and no reason to expect a second replay to
		// do better: cleared, rebuilt from m on.
		s.metrics.replay(s.a.spec.Name, "failed")
		s.log.Warn("kv events: replay failed after a reconnection; clearing the worker's event entries", "rank", s.rank, "from", from, "error", err)
		s.a.resetRank(s.rank, reasonRestart)
		s.apply(m)
	default:
		s.log.Warn("kv events: publisher restarted (its replay no longer has the last batch applied)", "rank", s.rank, "last", from, "got", m.Seq)
		s.a.resetRank(s.rank, reasonRestart)
		s.started = false
		s.first(ctx, m)
	}
}

// take applies replayed batch r unless it is applied already, or numbered more than
// replayAhead past live, the live message that asked for the replay (refused and
// counted); a hole before it clears the rank first (before the first batch of a replay
// from 0 there is nothing). It reports whether it cleared.
func (s *stream) take(r Message, reason string, live uint64) bool {
	if s.started && r.Seq <= s.last {
		return false
	}
	if r.Seq > live && r.Seq-live > replayAhead {
		s.metrics.decodeError(s.a.spec.Name)
		s.log.Warn("kv events: replayed batch numbered too far past the live stream; dropped", "rank", s.rank, "live", live, "got", r.Seq)
		return false
	}
	hole := s.started && r.Seq != s.last+1
	if hole {
		s.a.resetRank(s.rank, reason)
	}
	s.started = true
	s.apply(r)
	return hole
}

// settle ends a replay from seq from that ended with err and cleared the rank for a
// hole or not: it counts the replay, clears the rank after a failure, and applies m
// unless the replay did, clearing first if m does not follow what was applied.
func (s *stream) settle(err error, cleared bool, from uint64, reason string, m Message) {
	switch {
	case err != nil:
		s.metrics.replay(s.a.spec.Name, "failed")
		s.log.Warn("kv events: replay failed; clearing the worker's event entries", "rank", s.rank, "from", from, "error", err)
		if s.started {
			s.a.resetRank(s.rank, reason)
		}
	case cleared:
		s.metrics.replay(s.a.spec.Name, "partial")
	default:
		s.metrics.replay(s.a.spec.Name, "ok")
	}
	if !s.started || m.Seq > s.last {
		if s.started && m.Seq != s.last+1 && err == nil {
			// Published after the replay's end and still not contiguous: lost.
			s.a.resetRank(s.rank, reason)
		}
		s.started = true
		s.apply(m)
	}
}

// fingerprint hashes a batch's payload, to tell it from another numbered alike.
func (s *stream) fingerprint(payload []byte) uint64 {
	if s.seed == (maphash.Seed{}) {
		s.seed = maphash.MakeSeed()
	}
	return maphash.Bytes(s.seed, payload)
}

// lost clears the worker after handling a message panicked. The batch may be half
// applied, and the applier's maps (which every rank of the worker shares) half
// changed: every rank's entries are cleared, not this rank's alone. The stream keeps
// its place, as after an undecodable batch: apply numbered the batch it was applying
// before it panicked, and the next one (or a replay from it, after a gap) rebuilds
// the worker from there, without the batch that panicked, which a replay from an
// earlier number would bring back.
func (s *stream) lost() {
	s.log.Warn("kv events: a message's handling panicked; clearing the worker's event entries", "rank", s.rank, "last", s.last)
	s.a.reset(reasonPanic)
}

// apply decodes and applies one batch. An undecodable batch is lost: its removals may
// be missing, so the rank's entries are cleared.
func (s *stream) apply(m Message) {
	s.last = m.Seq
	if s.replay != nil {
		s.lastSum = s.fingerprint(m.Payload)
	}
	err := s.a.applyAt(s.rank, m.Payload, s.now())
	if err == nil {
		return
	}
	s.metrics.decodeError(s.a.spec.Name)
	s.log.Warn("kv events: undecodable batch; clearing the worker's event entries", "rank", s.rank, "seq", m.Seq, "error", err)
	if errors.Is(err, ErrPayload) {
		s.a.resetRank(s.rank, reasonDecode)
	}
}
