package kvevents

import (
	"context"
	"errors"
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

// stream checks one rank's sequence numbers and applies its batches (KV_EVENTS.md
// "semantics the consumer must respect"): the next number is applied; a jump is a gap,
// replayed from the first missing batch when the engine has a replay endpoint, else
// the rank's entries are cleared and rebuilt from what comes next; a number at or
// below the last one but above the last live message's, on the same connection, is a
// batch a replay delivered ahead of the live stream, dropped; otherwise a number at or
// below the last one after a reconnection, a pause, or a drop of more than dupWindow
// is a restarted publisher, whose rank is cleared (and replayed from 0 when possible);
// a recent one is a duplicate and dropped. A stream is driven by one goroutine.
type stream struct {
	a       *Applier
	rank    int
	replay  replayFunc // nil: the engine has no replay endpoint
	now     func() time.Time
	metrics *Metrics
	log     *slog.Logger

	started     bool // a batch of the current publisher process was applied
	last        uint64
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
	err := s.replay(ctx, from, func(r Message) {
		if s.started && r.Seq <= s.last {
			return
		}
		if s.started && r.Seq != s.last+1 {
			// A hole: before the first batch of a replay from 0 there is nothing.
			s.a.resetRank(s.rank, reason)
			cleared = true
		}
		s.started = true
		s.apply(r)
	})
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

// apply decodes and applies one batch. An undecodable batch is lost: its removals may
// be missing, so the rank's entries are cleared.
func (s *stream) apply(m Message) {
	s.last = m.Seq
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
