package scoring

import (
	"math"
	"time"
)

// A worker's prefill history, H(w) of prefill_history_weight: the uncached prompt
// tokens booked on it, each decayed by half every half-life. The ledger keeps one sum,
// the time of its last booking and that booking's half-life per worker
// (workerLoad.history, historyAt, historyHalfLife), so it costs three words a worker
// whatever the traffic, and goes with the worker's load. The other replicas' H (package
// peers, SetPeerHistory) is kept beside it, one sum per worker, and the cost adds the
// two.

// decayed is v, as of age ago, decayed by half every halfLife seconds; with no
// half-life the history is forgotten at once. A negative age (a clock stepped back)
// decays nothing.
func decayed(v float64, age time.Duration, halfLife float64) float64 {
	if v == 0 || halfLife <= 0 {
		return 0
	}
	if age <= 0 {
		return v
	}
	return v * math.Exp2(-age.Seconds()/halfLife)
}

// addHistory decays l's prefill history to now with halfLife (seconds) and adds
// tokens to it.
func (l *workerLoad) addHistory(tokens int, now time.Time, halfLife float64) {
	l.history = decayed(l.history, now.Sub(l.historyAt), halfLife) + float64(tokens)
	l.historyAt, l.historyHalfLife = now, halfLife
}

// removeHistory takes back tokens added to l's history at bookedAt (a booking that
// moved to another worker), as decayed to now; the history never goes below 0.
func (l *workerLoad) removeHistory(tokens int, bookedAt, now time.Time, halfLife float64) {
	l.history = max(0, decayed(l.history, now.Sub(l.historyAt), halfLife)-decayed(float64(tokens), now.Sub(bookedAt), halfLife))
	l.historyAt, l.historyHalfLife = now, halfLife
}

// fillHistory sets c's PrefillHistory and PrefillHistoryAge from l (nil: nothing
// booked there) at now, and its PeerPrefillHistory and PeerPrefillHistoryAge from
// peer (the zero value: none).
func (l *workerLoad) fillHistory(c *Candidate, peer peerHistory, now time.Time) {
	c.PeerPrefillHistory, c.PeerPrefillHistoryAge = 0, 0
	if peer.tokens > 0 {
		c.PeerPrefillHistory, c.PeerPrefillHistoryAge = peer.tokens, now.Sub(peer.at)
	}
	if l == nil || l.history == 0 {
		c.PrefillHistory, c.PrefillHistoryAge = 0, 0
		return
	}
	c.PrefillHistory, c.PrefillHistoryAge = l.history, now.Sub(l.historyAt)
}

// History is a worker's prefill history as a ledger reports it to the other replicas
// (package peers): Tokens, the uncached prompt tokens booked there, decayed at each
// booking with the half-life that decision was made with, as of the worker's last
// booking, which was Age before the history was read. From that booking on they decay
// by half every HalfLife seconds, its half-life, until the next. Tokens and HalfLife
// change only at a booking on the worker: a History read again later differs in its
// Age alone.
type History struct {
	Tokens   float64
	Age      time.Duration
	HalfLife float64
}

// After is H(w) later after h was read: Tokens decayed over Age + later.
func (h History) After(later time.Duration) float64 {
	return decayed(h.Tokens, h.Age+later, h.HalfLife)
}

// PrefillHistories returns every worker's prefill history, this ledger's own (not the
// peers'): what package peers reports to the other replicas. Workers without any (none
// booked, or a half-life of 0) are left out. Between two bookings a History decays as
// its HalfLife says, and [Bookings.Version] does not move: a report of it need not be
// sent again as time passes.
func (b *Bookings) PrefillHistories() map[string]History {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	var out map[string]History
	for worker, l := range b.workers {
		h := History{Tokens: l.history, Age: max(0, now.Sub(l.historyAt)), HalfLife: l.historyHalfLife}
		if h.After(0) <= 0 {
			continue
		}
		if out == nil {
			out = make(map[string]History)
		}
		out[worker] = h
	}
	return out
}

// peerHistory is the prefill history the other replicas reported on a worker, summed,
// as of at on this ledger's clock.
type peerHistory struct {
	tokens float64
	at     time.Time
}

// SetPeerHistory records the prefill history other routers sharing the worker (other
// kvroute replicas) last reported there, summed, as of now on this ledger's clock:
// [Bookings.Fill] gives it to the cost beside this ledger's own (PeerPrefillHistory),
// which decays it from now with the half-life in force for the request and adds it to
// H(w). Tokens are clamped to [0, MaxPeerCount] (NaN is 0); 0 forgets the worker's.
// [Bookings.PrefillHistory] and [Bookings.PrefillHistories] stay this ledger's own.
// Package peers calls it with what the other replicas report; replay's
// -share-interval with the other simulated replicas' histories.
func (b *Bookings) SetPeerHistory(worker string, tokens float64) {
	if !(tokens > 0) { // NaN too
		tokens = 0
	}
	tokens = min(tokens, MaxPeerCount)
	b.mu.Lock()
	defer b.mu.Unlock()
	if tokens == 0 {
		delete(b.peerHistory, worker)
		return
	}
	if b.peerHistory == nil {
		b.peerHistory = make(map[string]peerHistory)
	}
	b.peerHistory[worker] = peerHistory{tokens: tokens, at: b.now()}
}

// BookDecision is [Bookings.BookAdapter] for a routing decision priced with a
// prefill_history_half_life of historyHalfLife seconds: the worker's prefill history
// is decayed to now with it before prefillTokens join it. The router books every
// decision through it, with the half-life in force for the request.
func (b *Bookings) BookDecision(worker, lora string, blocks []uint64, prefillTokens int, historyHalfLife float64) *Booking {
	return b.book(worker, lora, blocks, prefillTokens, historyHalfLife, 1)
}

// BookSequences is [Bookings.BookDecision] for a request the engine runs as sequences
// sequences (its parallel samples, the prompts of its batch; fewer than one is one):
// each counts in N, and in W until the first token, as the engine's running and
// waiting requests count them; its blocks and prefill count once, since the sequences
// share the prompt.
func (b *Bookings) BookSequences(worker, lora string, blocks []uint64, prefillTokens int, historyHalfLife float64, sequences int) *Booking {
	return b.book(worker, lora, blocks, prefillTokens, historyHalfLife, sequences)
}

// PrefillHistory returns the worker's prefill history decayed to now with halfLife
// (seconds): H(w) as the cost would see it. An unknown worker has none.
func (b *Bookings) PrefillHistory(worker string, halfLife float64) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.workers[worker]
	if l == nil {
		return 0
	}
	return decayed(l.history, b.now().Sub(l.historyAt), halfLife)
}
