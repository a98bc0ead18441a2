package flowcontrol

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/router"
)

// Refusals of flow control; the edge answers both with a 429 and retry-after, as it
// answers the router's refusals for capacity they stand in for.
var (
	// ErrQueueFull: max_queued requests were held already.
	ErrQueueFull = errors.New("flowcontrol: flow_control.max_queued requests are held already")
	// ErrShuttingDown: kvroute began to drain while the request was held (Close);
	// answered at once, it can be retried on another replica, where a stream cut at the
	// end of the shutdown grace gets Envoy's 500.
	ErrShuttingDown = errors.New("flowcontrol: kvroute is shutting down")
	// ErrTimedOut: no worker could take the request within flow_control.max_wait.
	ErrTimedOut = errors.New("flowcontrol: no worker could take the request within flow_control.max_wait")
)

// How often the head of a queue is looked at again. PollInterval bounds how late a
// freed slot is seen (the ledger's version is read, an atomic load); RetryInterval is
// how often the head is tried with no change of the ledger seen, for what changes
// outside it (the engines' scraped queues, the peers' loads, a worker back from a
// health back-off).
const (
	PollInterval  = 5 * time.Millisecond
	RetryInterval = 50 * time.Millisecond
)

// Router is what flow control needs of the decision engine; *router.Router satisfies
// it.
type Router interface {
	Route(ctx context.Context, req *router.Request) (*router.Decision, error)
	// Priority is the request's priority (its GIE objective's): higher goes first.
	Priority(req *router.Request) int
	// HasRoom reports whether worker may take one more request now: a request waiting
	// for that worker (holder_wait) is not tried while it has none.
	HasRoom(worker string) bool
	// StillWaits reports, without a decision, whether a request Route refused with
	// busy would still wait for that worker: asked once a retry interval of a request
	// waiting for a worker without room, which is tried again when not.
	StillWaits(busy *router.HolderBusyError) bool
}

// Ledger tells whether the booked load changed since it was last read: its version
// moves at every booking, first token and release. *scoring.Bookings satisfies it.
type Ledger interface {
	Version() uint64
}

// Deps are what a Queue works with.
type Deps struct {
	// Router routes the requests; required.
	Router Router
	// Ledger's version moving wakes the queues' heads; required.
	Ledger Ledger
	// Metrics records the held requests and their outcomes; nil records nothing.
	Metrics *Metrics
	// Panics counts the router's answers about a held request that panicked (loop
	// flow_control), logged to Log; either may be nil.
	Panics *background.Metrics
	Log    *slog.Logger
	// Now is the clock of the waits measured; nil: time.Now.
	Now func() time.Time
	// After is the timer of max_wait and of the intervals; nil: time.After.
	After func(time.Duration) <-chan time.Time
}

// Queue is flow control in front of a Router: it routes like the router when the
// router can, and holds the requests it refuses for capacity. It satisfies the
// filter's Router. Build it with [New].
type Queue struct {
	cfg  Config
	deps Deps
	// guard recovers a panic of the router's HasRoom or StillWaits, asked under mu.
	guard background.Guard

	mu     sync.Mutex
	groups map[string]*group // by queueKey; a group leaves when its queues are empty
	held   int               // requests held over every model
	seq    uint64            // numbers the waiters in arrival order
	// closed: Close was called (kvroute drains); closing is closed then, waking every
	// held request.
	closed  bool
	closing chan struct{}
}

// group is the queues one dispatcher serves: a model's requests (or those narrowed
// alike: queueKey), in one queue for those any of its workers may take and one per
// busy worker that some of them wait for (flow_control.holder_wait). One dispatcher
// orders them all, so that a freed slot goes to the highest priority, then the fairness
// id whose turn comes first, then the oldest, of the queues' heads, whichever queue it
// waits in.
type group struct {
	// queues by the worker their requests wait for, "" for any; a queue leaves when
	// empty.
	queues map[string]*modelQueue
	// dispatching: a goroutine (dispatch) tries the heads; it ends when every queue is
	// empty.
	dispatching bool
	// kick wakes the dispatcher when a head may have changed (a request came or left).
	kick chan struct{}
	// retries counts the retry intervals passed: a head refused before the last one is
	// tried again though the ledger has not moved.
	retries uint64
	// turns are the fairness ids' turns at each priority, shared by the group's queues,
	// so that a fairness id whose request went from one queue waits for its next turn in
	// every other (round robin across the queues, not within each): the flow with the
	// earliest turn goes next. A fairness id that comes takes the round's last turn, and
	// so does one whose request goes. lastTurn is the latest turn given.
	turns    map[flowKey]*turn
	lastTurn uint64
}

// newGroup is a group with no queue yet.
func newGroup() *group {
	return &group{queues: make(map[string]*modelQueue), kick: make(chan struct{}, 1), turns: make(map[flowKey]*turn)}
}

// flowKey names a fairness id's flows of one priority, in whichever queue of a group.
type flowKey struct {
	priority int
	id       string
}

// turn is a fairness id's place in the round of its priority (at: the lower, the
// sooner), kept while flows of it wait in the group's queues (flows: one a queue at
// most), and across a move between queues (requeue).
type turn struct {
	at    uint64
	flows []*flow
}

// join gives f its fairness id's turn: theirs if flows of it wait in other queues of
// the group, else a new one, the round's last. f goes in its band's flows by turn.
// Called under mu.
func (g *group) join(b *band, f *flow) {
	key := flowKey{b.priority, f.id}
	t := g.turns[key]
	if t == nil {
		g.lastTurn++
		t = &turn{at: g.lastTurn}
		g.turns[key] = t
	}
	t.flows = append(t.flows, f)
	f.turn = t
	// By turn: the flows of a band are in the order of their turns, so its next is the
	// first. A new turn is the last; a fairness id's turn from another queue may come
	// sooner (walked from the back: only flows that came after it are passed).
	e := b.flows.Back()
	for e != nil && e.Value.(*flow).turn.at > t.at {
		e = e.Prev()
	}
	if e == nil {
		f.element = b.flows.PushFront(f)
	} else {
		f.element = b.flows.InsertAfter(f, e)
	}
}

// leave takes f, emptied, out of its band and of its turn, which is forgotten with
// its last flow. Called under mu.
func (g *group) leave(b *band, f *flow) {
	b.flows.Remove(f.element)
	delete(b.byID, f.id)
	f.turn.flows = slices.DeleteFunc(f.turn.flows, func(x *flow) bool { return x == f })
	if len(f.turn.flows) == 0 {
		delete(g.turns, flowKey{b.priority, f.id})
	}
}

// served gives t the round's last turn, its fairness id's request having gone: each of
// its flows goes to the back of its band. Called under mu.
func (g *group) served(t *turn) {
	g.lastTurn++
	t.at = g.lastTurn
	for _, f := range t.flows {
		f.band.flows.MoveToBack(f.element)
	}
}

// modelQueue holds the requests of a group that wait for one worker (or for any): by
// priority (bands, highest first), in each the flows (fairness ids) taking turns round
// robin with the group's other queues (group.turns), each first come first served.
type modelQueue struct {
	bands []*band
	group *group
}

// The flows of a band and the requests of a flow are linked lists: a request leaves
// from anywhere (max_wait ends them oldest first, a client goes at any time) and a
// flow comes and goes with its requests, each under mu, which every request through
// flow control takes, up to max_queued (MaxMaxQueued) of them. In slices each took
// time growing with the requests held (BenchmarkHeldRequestLeaves): with 2^17 held in
// one flow, 340 µs a departure, 45 s under mu for all of them timing out.
type band struct {
	priority int
	// flows (of *flow) in the order of their turns (group.turns): the first goes next.
	flows list.List
	byID  map[string]*flow
}

type flow struct {
	id      string
	waiters list.List // of *waiter, oldest first
	band    *band
	element *list.Element // in its band's flows
	// turn is its fairness id's, shared with its flows of the same priority in the
	// group's other queues.
	turn *turn
}

// insert puts w among f's waiters in arrival order (seq), and returns its element. A
// newcomer goes last; a request that moves from another queue of its group goes after
// those that came before it. The walk starts from the newest: a request moves after
// waiting at most holder_wait, so fewer came after it than before it in a backlog that
// has waited up to max_wait, and a move costs what came since, not the backlog.
func (f *flow) insert(w *waiter) *list.Element {
	e := f.waiters.Back()
	for e != nil && e.Value.(*waiter).seq > w.seq {
		e = e.Prev()
	}
	if e == nil {
		return f.waiters.PushFront(w)
	}
	return f.waiters.InsertAfter(w, e)
}

type waiterState int

const (
	stateQueued  waiterState = iota // in its flow, waiting for its turn
	stateRouting                    // the dispatcher is routing it
	stateDone                       // out of the queue; its result is sent
)

type waiter struct {
	ctx   context.Context
	req   *router.Request
	since time.Time
	queue *modelQueue
	band  *band
	flow  *flow
	// element is the waiter's in its flow's waiters.
	element *list.Element
	state   waiterState
	// holder: the worker the request waits for (its queue is that worker's); "": any.
	holder string
	// busy is the refusal that named holder. While holder has no room, waits is
	// whether the request still waits for it (Router.StillWaits), as last asked with
	// the group at checkedRetry retries; a refusal naming holder answers too.
	busy         *router.HolderBusyError
	waits        bool
	checkedRetry uint64
	// seq orders waiters of one priority across the group's queues: the oldest first.
	seq uint64
	// priority is the request's (Router.Priority), read as it came: its band in
	// whichever queue of its group it waits.
	priority int
	// tried: the router refused it for capacity at the ledger's triedVersion, with the
	// group at triedRetry retries; it is not tried again until either moves.
	tried                    bool
	triedVersion, triedRetry uint64
	// leaving: the request's wait ended (max_wait, cancel) while it was being routed;
	// the dispatcher sends it whatever that routing gave, held again or not.
	leaving bool
	result  chan routed // capacity 1: the dispatcher never blocks on it
}

type routed struct {
	decision *router.Decision
	err      error
	// panicked: the routing panicked; the request's goroutine panics again with it.
	panicked *routingPanic
}

// routingPanic is what a request held by flow control panics with when the routing
// the dispatcher made for it panicked. The dispatcher recovers it and serves the rest
// of its queue; the request's own goroutine (its stream's) panics again, so the
// server's recovery fails that stream alone, as it does when a routing made at once
// panics.
type routingPanic struct {
	value any
	stack []byte // the dispatcher's, where the routing panicked
}

func (p *routingPanic) Error() string {
	return fmt.Sprintf("flowcontrol: routing a held request panicked: %v\n%s", p.value, p.stack)
}

// New returns flow control in front of deps.Router. With cfg.Enabled false it passes
// every request straight to the router.
func New(cfg Config, deps Deps) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Router == nil || deps.Ledger == nil {
		return nil, errors.New("flowcontrol: Deps.Router and Deps.Ledger are required")
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.After == nil {
		deps.After = time.After
	}
	q := &Queue{cfg: cfg, deps: deps, groups: make(map[string]*group), closing: make(chan struct{})}
	if cfg.Enabled {
		// Disabled, it holds nothing and asks nothing: no series at 0 for a loop that
		// does not run.
		q.guard = background.NewGuard(background.LoopFlowControl, deps.Log, deps.Panics)
	}
	return q, nil
}

// held reports whether err is a refusal for capacity that flow control holds a request
// for rather than answer.
func held(err error) bool {
	return errors.Is(err, router.ErrOverloaded) || errors.Is(err, router.ErrSaturated)
}

// Route routes req, holding it while the router refuses it for capacity
// (router.ErrOverloaded, router.ErrSaturated), for at most max_wait. While its model's
// queue holds requests that go before it, req waits its turn there without being tried
// first. It returns ErrQueueFull or ErrTimedOut when it gives up, ctx's error when ctx
// ends first, and the router's decision or error otherwise. On a decision the caller
// owns its booking, as with the router's.
func (q *Queue) Route(ctx context.Context, req *router.Request) (*router.Decision, error) {
	if !q.cfg.Enabled {
		return q.deps.Router.Route(ctx, req)
	}
	req.Held, req.HoldOnSaturation = true, q.cfg.HoldOnSaturation
	req.WaitForHolder = q.cfg.HolderWait > 0
	var busy *router.HolderBusyError
	q.mu.Lock()
	if q.first(req) {
		// Nothing of its model is held that goes before it: the router decides at once,
		// as without flow control, unless it refuses for capacity. Tried only once
		// enqueued, a request of a higher priority than every held one would be refused
		// at a queue full of them (sheddable requests held while the fleet is saturated),
		// though a worker could take it.
		q.mu.Unlock()
		d, err := q.deps.Router.Route(ctx, req)
		if !held(err) {
			return d, err
		}
		busy = holderBusy(err)
		q.mu.Lock()
	}
	if q.closed {
		// Draining: nothing is held any more; the router's answer, as without flow
		// control, which refuses no request of priority 0 for saturation, waits for no
		// busy holder while another worker has room, and counts a sheddable request's
		// refusal as a shed.
		q.mu.Unlock()
		req.Held, req.HoldOnSaturation, req.WaitForHolder = false, false, false
		return q.deps.Router.Route(ctx, req)
	}
	if q.held >= q.cfg.MaxQueued {
		q.mu.Unlock()
		q.deps.Metrics.ended(OutcomeQueueFull, 0)
		return nil, ErrQueueFull
	}
	w := q.newWaiter(ctx, req)
	q.requeue(w, busy)
	q.mu.Unlock()
	if req.OnHeld != nil {
		req.OnHeld()
	}
	return q.wait(ctx, w)
}

// newWaiter is a request about to be held, from now. Called under mu, on the request's
// goroutine (priorityOf).
func (q *Queue) newWaiter(ctx context.Context, req *router.Request) *waiter {
	priority := q.priorityOf(req)
	q.seq++
	return &waiter{ctx: ctx, req: req, priority: priority, since: q.deps.Now(), seq: q.seq, result: make(chan routed, 1)}
}

// priorityOf is the router's Priority of req, asked under mu on the request's
// goroutine, as the request comes. Its panic (a bug of the router's) goes on in that
// goroutine, whose server recovery fails the request's stream alone, as without flow
// control; mu is unlocked on its way out, as a lock left held would stop flow control.
// The dispatcher never asks it: a request it moves keeps the priority it came with.
func (q *Queue) priorityOf(req *router.Request) int {
	asked := false
	defer func() {
		if !asked {
			q.mu.Unlock()
		}
	}()
	priority := q.deps.Router.Priority(req)
	asked = true
	return priority
}

// queueKey names the group of queues req waits in: its model's, or, for a request
// whose candidates are narrowed to some of the model's workers (a GIE subset hint, a
// stored response pinned to the worker that stored it), a group of its own for the
// model and that narrowing. Only a queue's head is tried, so a request only a busy
// worker can take would otherwise hold back every request of its model while other
// workers idle.
//
// Within its group, a request waiting for the busy worker that holds the most of its
// prompt (flow_control.holder_wait) waits in a queue of that worker's, so that the
// rest of its model goes to the workers that free meanwhile.
func queueKey(req *router.Request) string {
	if len(req.Subset) == 0 && req.PreviousResponseID == "" {
		return req.Model
	}
	var b strings.Builder
	b.WriteString(req.Model)
	for _, s := range req.Subset {
		b.WriteByte(0)
		b.WriteString(s)
	}
	b.WriteString("\x00stored\x00")
	b.WriteString(req.PreviousResponseID)
	return b.String()
}

// first reports whether no request held for req's model goes before req: none is
// held, or req's priority is higher than theirs. A request waiting for a worker still
// full (holder_wait) does not count: the dispatcher would not try it either (next).
// Called under mu, on the request's goroutine (priorityOf).
func (q *Queue) first(req *router.Request) bool {
	g := q.groups[queueKey(req)]
	if g == nil {
		return true
	}
	priority := q.priorityOf(req)
	for holder, mq := range g.queues {
		w := mq.head()
		if w == nil || q.passedOver(g, holder, w) {
			continue
		}
		if priority <= w.band.priority {
			return false
		}
	}
	return true
}

// enqueue adds w, the waiter for req, to its group's queue for holder ("": any
// worker), in the band of its priority, and makes sure a dispatcher serves the group.
// Called under mu.
func (q *Queue) enqueue(ctx context.Context, req *router.Request, w *waiter, holder string) *waiter {
	priority := w.priority
	key := queueKey(req)
	g := q.groups[key]
	if g == nil {
		g = newGroup()
		q.groups[key] = g
	}
	mq := g.queues[holder]
	if mq == nil {
		mq = &modelQueue{group: g}
		g.queues[holder] = mq
	}
	// Highest priority first.
	i, found := slices.BinarySearchFunc(mq.bands, priority, func(b *band, p int) int { return cmp.Compare(p, b.priority) })
	if !found {
		mq.bands = slices.Insert(mq.bands, i, &band{priority: priority, byID: make(map[string]*flow)})
	}
	b := mq.bands[i]
	f := b.byID[req.FairnessID]
	if f == nil {
		// A flow that comes takes its fairness id's turn if the id waits in another
		// queue of the group, else (it comes, or comes back: it left when it emptied)
		// the round's last: after the flows that have waited since before it last went,
		// or flows coming back one after the other would keep them waiting until
		// max_wait.
		f = &flow{id: req.FairnessID, band: b}
		b.byID[f.id] = f
		g.join(b, f)
	}
	w.queue, w.band, w.flow, w.holder, w.state = mq, b, f, holder, stateQueued
	w.tried = false
	w.element = f.insert(w)
	q.held++
	q.deps.Metrics.setHeld(q.held)
	if !g.dispatching {
		g.dispatching = true
		go q.dispatch(key, g)
	} else {
		g.wake()
	}
	return w
}

// wake tells the dispatcher a head may have changed.
func (g *group) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// next is the head of g's queues to try: of those not refused since the ledger was at
// version and the last retry interval, nor waiting for a worker still full, the one of
// the highest priority, then the oldest. Called under mu.
func (q *Queue) next(g *group, version uint64) *waiter {
	var best *waiter
	for holder, mq := range g.queues {
		w := mq.head()
		if w == nil || (w.tried && w.triedVersion == version && w.triedRetry == g.retries) {
			continue
		}
		if q.passedOver(g, holder, w) {
			continue
		}
		if best == nil || goesBefore(w, best) {
			best = w
		}
	}
	return best
}

// goesBefore reports whether a, the head of a queue, goes before b, another queue's, in
// their group: the higher priority, then the fairness id whose turn comes first, then
// the older.
func goesBefore(a, b *waiter) bool {
	if a.band.priority != b.band.priority {
		return a.band.priority > b.band.priority
	}
	if a.flow.turn.at != b.flow.turn.at {
		return a.flow.turn.at < b.flow.turn.at
	}
	return a.seq < b.seq
}

// head is the request that goes next: of the highest priority's flows, the one whose
// turn comes first (group.turns), its oldest request. Called under mu.
func (mq *modelQueue) head() *waiter {
	if mq == nil || len(mq.bands) == 0 {
		return nil
	}
	return mq.bands[0].flows.Front().Value.(*flow).waiters.Front().Value.(*waiter)
}

// remove takes w out of its queue; dispatched gives its fairness id the round's last
// turn. Empty flows and bands go. Called under mu.
func (q *Queue) remove(w *waiter, dispatched bool) {
	b, f, g := w.band, w.flow, w.queue.group
	f.waiters.Remove(w.element)
	if dispatched {
		g.served(f.turn)
	}
	if f.waiters.Len() == 0 {
		g.leave(b, f)
	}
	if b.flows.Len() == 0 {
		mq := w.queue
		mq.bands = slices.DeleteFunc(mq.bands, func(x *band) bool { return x == b })
		if len(mq.bands) == 0 && mq.group.queues[w.holder] == mq {
			delete(mq.group.queues, w.holder)
		}
	}
	w.state = stateDone
	q.held--
	q.deps.Metrics.setHeld(q.held)
}

// dispatch serves one group's queues until they are empty: it routes the heads
// whenever something may have changed for them, highest priority, then fairness id in
// turns, then oldest first (group.next), and hands each request its result. A head the
// router refuses for capacity again waits in the queue its refusal names: its busy
// holder's, or, with no holder named, the queue any worker may take from. It stays its
// queue's head when that is its queue already, and moves, keeping its place by arrival
// and its fairness id's turn, when not.
func (q *Queue) dispatch(key string, g *group) {
	retry := q.deps.After(RetryInterval)
	for {
		q.mu.Lock()
		if len(g.queues) == 0 {
			g.dispatching = false
			delete(q.groups, key)
			q.mu.Unlock()
			return
		}
		select {
		case <-retry:
			// A retry interval passed while the dispatcher had heads to try (the ledger
			// moving between any two tries, in a busy fleet): it counts as well, or a head
			// waiting for its full worker would not be asked whether it still waits
			// (passedOver) until the dispatcher ran out of heads to try.
			g.retries++
			retry = q.deps.After(RetryInterval)
		default:
		}
		version := q.deps.Ledger.Version()
		w := q.next(g, version)
		if w == nil {
			q.mu.Unlock()
			select {
			case <-g.kick:
			case <-q.deps.After(PollInterval):
			case <-retry:
				q.mu.Lock()
				g.retries++
				q.mu.Unlock()
				retry = q.deps.After(RetryInterval)
			}
			continue
		}
		w.state = stateRouting
		w.req.WaitForHolder = q.waitsForHolder(w)
		q.mu.Unlock()

		r := q.route(w)

		q.mu.Lock()
		if r.panicked == nil && held(r.err) && !w.leaving {
			w.state = stateQueued
			q.requeue(w, holderBusy(r.err))
			w.tried, w.triedVersion, w.triedRetry = true, version, g.retries
			q.mu.Unlock()
			continue
		}
		q.remove(w, r.decision != nil)
		q.mu.Unlock()
		w.result <- r
	}
}

// route routes w's request. A panic of the routing is recovered here, or it would end
// the process (no server recovery runs on the dispatcher's goroutine) and leave every
// request of the queue waiting: it is handed to the request (routingPanic). The router
// released whatever the routing had booked as the panic went through it.
func (q *Queue) route(w *waiter) (r routed) {
	defer func() {
		if p := recover(); p != nil {
			r = routed{panicked: &routingPanic{value: p, stack: debug.Stack()}}
		}
	}()
	r.decision, r.err = q.deps.Router.Route(w.ctx, w.req)
	return r
}

// wait waits for w's result, max_wait or ctx's end, whichever comes first.
func (q *Queue) wait(ctx context.Context, w *waiter) (*router.Decision, error) {
	select {
	case r := <-w.result:
		return q.took(w, r)
	case <-ctx.Done():
		return q.leave(w, ctx.Err(), OutcomeCancelled)
	case <-q.deps.After(q.cfg.MaxWait):
		return q.leave(w, ErrTimedOut, OutcomeTimedOut)
	case <-q.closing:
		return q.leave(w, ErrShuttingDown, OutcomeShutdown)
	}
}

// Close ends flow control, as kvroute starts to drain: every request held gets
// ErrShuttingDown at once (unless a routing under way for it gives a decision, which
// it takes), and later requests get the router's answer, as without flow control. A
// held request answered now can be retried on another replica; one still held at the
// end of the shutdown grace would be cut. Safe to call more than once.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.closing)
	}
}

// took records a result the dispatcher gave and returns it; a routing that panicked
// panics again here, in the request's goroutine.
func (q *Queue) took(w *waiter, r routed) (*router.Decision, error) {
	outcome := OutcomeDispatched
	switch {
	case r.panicked != nil:
		q.deps.Metrics.ended(OutcomeFailed, q.deps.Now().Sub(w.since))
		panic(r.panicked)
	case r.err != nil && w.ctx.Err() != nil && errors.Is(r.err, w.ctx.Err()):
		// The routing found the client gone (the router checks its context), and its
		// result won wait's select over the context's end: a cancel, not a failure.
		outcome = OutcomeCancelled
	case r.err != nil:
		outcome = OutcomeFailed
	}
	q.deps.Metrics.ended(outcome, q.deps.Now().Sub(w.since))
	return r.decision, r.err
}

// leave ends w's wait for why. A request still queued leaves at once; one being routed
// waits for that routing: a decision it gives is taken when max_wait passed (a worker
// took it after all) and released when the client went away.
func (q *Queue) leave(w *waiter, why error, outcome string) (*router.Decision, error) {
	q.mu.Lock()
	if w.state == stateQueued {
		q.remove(w, false)
		w.queue.group.wake()
		q.mu.Unlock()
		q.deps.Metrics.ended(outcome, q.deps.Now().Sub(w.since))
		return nil, why
	}
	w.leaving = true
	q.mu.Unlock()
	r := <-w.result
	switch {
	case r.panicked != nil:
		return q.took(w, r)
	case outcome == OutcomeCancelled:
		// Nobody waits for an answer: a booking made meanwhile is nobody's.
		if r.decision != nil {
			r.decision.Release()
		}
	case r.decision != nil || !held(r.err):
		return q.took(w, r)
	}
	q.deps.Metrics.ended(outcome, q.deps.Now().Sub(w.since))
	return nil, why
}

// Held reports the requests held now, over every model.
func (q *Queue) Held() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.held
}
