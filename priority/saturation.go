package priority

import "time"

// Sheddable reports whether a request of this priority may be refused when the fleet
// is saturated: below 0, as GIE's endpoint picker decides (util/request.IsSheddable).
func Sheddable(priority int) bool { return priority < 0 }

// Load is what is known of one candidate worker's load when a sheddable request is
// admitted.
type Load struct {
	// Known says the worker's engine metrics were read, and recently enough for
	// engine_metrics to trust them; Age is how long ago.
	Known bool
	Age   time.Duration
	// Waiting is the engine's queue at that reading; KVUtilization the share of its KV
	// cache in use, in [0, 1].
	Waiting       int
	KVUtilization float64
	// BookedQueue is the requests booked on the worker (by this replica, its peers, and
	// those its engine runs past kvroute) beyond its batch slots: max(0, N(w) − S(w)),
	// 0 when S(w) is unknown. The engine queues them, whether or not its last scrape
	// saw them yet.
	BookedQueue int
}

// Saturation is the rule a sheddable request is admitted by: GIE's saturation detector
// as its endpoint picker applied it to sheddable requests through v1.3 (pkg/epp/
// saturationdetector): a worker has capacity when its metrics are fresh, its queue is
// at most QueueDepth and its KV cache use at most KVCacheUtil; the fleet is saturated
// when no candidate has capacity. kvroute's own bookings count in the queue, so a burst
// it routed between two scrapes saturates at once.
type Saturation struct {
	// QueueDepth is the most waiting requests a worker with capacity has.
	QueueDepth int
	// KVCacheUtil is the most KV cache use a worker with capacity reports, in (0, 1].
	KVCacheUtil float64
	// Staleness, when > 0, is the oldest engine reading a worker with capacity may
	// have; 0 trusts every reading Load.Known marks.
	Staleness time.Duration
}

// HasCapacity reports whether a worker of this load can take a sheddable request. A
// worker whose engine metrics are unknown or stale has none: GIE's detector does not
// route into load it cannot see.
func (s Saturation) HasCapacity(l Load) bool {
	return s.Fresh(l) && max(l.Waiting, l.BookedQueue) <= s.QueueDepth && l.KVUtilization <= s.KVCacheUtil
}

// Fresh reports whether the load's engine reading is known and young enough to trust.
func (s Saturation) Fresh(l Load) bool {
	return l.Known && (s.Staleness <= 0 || l.Age <= s.Staleness)
}
