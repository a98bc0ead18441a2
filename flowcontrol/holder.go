package flowcontrol

import (
	"errors"

	"github.com/kvroute/kvroute/router"
)

// The queues of the requests waiting for a busy worker (flow_control.holder_wait).

// holderBusy is the refusal naming the busy worker the request waits for, nil for
// another refusal.
func holderBusy(err error) *router.HolderBusyError {
	var busy *router.HolderBusyError
	if errors.As(err, &busy) {
		return busy
	}
	return nil
}

// requeue puts w, refused for capacity (busy naming its holder, or nil), in the queue
// of its group that the refusal names: its holder's, or any worker's. A newcomer joins
// it; a request in another queue of the group moves there, keeping its place by
// arrival; one already there stays. The refusal answers for the current retry interval
// whether it still waits for its holder. Called under mu.
func (q *Queue) requeue(w *waiter, busy *router.HolderBusyError) {
	holder := ""
	if busy != nil {
		holder = busy.Worker
	}
	if w.queue == nil {
		q.enqueue(w.ctx, w.req, w, holder)
	} else if holder != w.holder {
		// It waits for its holder now: in that worker's queue, out of the way of the
		// requests any worker can take. Or it waited for a worker and was refused for
		// another reason (every worker full with none holding the most of it, the
		// fleet saturated for it): any worker may take it, so it waits with the
		// requests any worker can take, rather than be passed over while the worker it
		// waited for is full.
		// Its fairness id keeps its turn across the move, though this was its last
		// request waiting: the turn, forgotten with its last flow, is the group's again
		// for the flow it joins (group.join).
		kept, g, key := w.flow.turn, w.queue.group, flowKey{w.band.priority, w.flow.id}
		q.remove(w, false)
		g.turns[key] = kept
		q.enqueue(w.ctx, w.req, w, holder)
	}
	w.busy, w.waits, w.checkedRetry = busy, true, w.queue.group.retries
}

// waitsForHolder reports whether w may still wait for its holder: holder_wait has not
// passed since it was first held.
func (q *Queue) waitsForHolder(w *waiter) bool {
	return q.cfg.HolderWait > 0 && q.deps.Now().Sub(w.since) < q.cfg.HolderWait
}

// passedOver reports whether w, the head of g's queue for holder ("": any worker's),
// still waits for that worker, which has no room, and would still wait if decided now:
// neither does the dispatcher try it nor does a newcomer queue behind it. Whether it
// would still wait is asked of the router (Router.StillWaits, no decision) at most
// once a retry interval, not at each change of the bookings, in case its prompt came
// to be held elsewhere or its prefix turned into a hot shared one. Called under mu.
func (q *Queue) passedOver(g *group, holder string, w *waiter) bool {
	if holder == "" || !q.waitsForHolder(w) || q.hasRoom(holder) {
		return false
	}
	if w.checkedRetry != g.retries {
		w.waits, w.checkedRetry = q.stillWaits(w.busy), g.retries
	}
	return w.waits
}

// stillWaits is the router's StillWaits, asked under mu; its panic is logged and
// counted (loop flow_control) and counts as no, as HasRoom's counts as room (hasRoom).
func (q *Queue) stillWaits(busy *router.HolderBusyError) (waits bool) {
	_ = q.guard.Do(func() error {
		waits = q.deps.Router.StillWaits(busy)
		return nil
	})
	return waits
}

// hasRoom is the router's HasRoom, asked under mu. Its panic (a bug of the router's)
// is recovered, logged and counted (loop flow_control), or it would end the process on
// the dispatcher's goroutine, or leave mu held on a request's, stopping flow control:
// the worker counts as having room, so the request waiting for it is tried, a whole
// decision, whose own panic goes to the request (route).
func (q *Queue) hasRoom(worker string) (room bool) {
	room = true
	_ = q.guard.Do(func() error {
		room = q.deps.Router.HasRoom(worker)
		return nil
	})
	return room
}
