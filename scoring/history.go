package scoring

import (
	"math"
	"time"
)

// A worker's prefill history, H(w) of prefill_history_weight: the uncached prompt
// tokens booked on it, each decayed by half every half-life. The ledger keeps one sum
// and the time of its last booking per worker (workerLoad.history, historyAt), so it
// costs two words a worker whatever the traffic, and goes with the worker's load.

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
	l.historyAt = now
}

// removeHistory takes back tokens added to l's history at bookedAt (a booking that
// moved to another worker), as decayed to now; the history never goes below 0.
func (l *workerLoad) removeHistory(tokens int, bookedAt, now time.Time, halfLife float64) {
	l.history = max(0, decayed(l.history, now.Sub(l.historyAt), halfLife)-decayed(float64(tokens), now.Sub(bookedAt), halfLife))
	l.historyAt = now
}

// fillHistory sets c's PrefillHistory and PrefillHistoryAge from l (nil: nothing
// booked there) at now.
func (l *workerLoad) fillHistory(c *Candidate, now time.Time) {
	if l == nil || l.history == 0 {
		c.PrefillHistory, c.PrefillHistoryAge = 0, 0
		return
	}
	c.PrefillHistory, c.PrefillHistoryAge = l.history, now.Sub(l.historyAt)
}

// BookDecision is [Bookings.BookAdapter] for a routing decision priced with a
// prefill_history_half_life of historyHalfLife seconds: the worker's prefill history
// is decayed to now with it before prefillTokens join it. The router books every
// decision through it, with the half-life in force for the request.
func (b *Bookings) BookDecision(worker, lora string, blocks []uint64, prefillTokens int, historyHalfLife float64) *Booking {
	return b.book(worker, lora, blocks, prefillTokens, historyHalfLife)
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
