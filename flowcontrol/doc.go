// Package flowcontrol holds requests in kvroute while no candidate worker has capacity
// for them, and lets them go by priority, then fairness, then arrival, as capacity
// frees: the step between reading a request and its routing decision (DESIGN §6's
// admission), as the Gateway API Inference Extension's flow control does in its
// endpoint picker (llm-d-router's pkg/epp/flowcontrol).
//
// Without it, a request no worker can take is refused at once with a 429 (every
// candidate at max_active_requests_per_worker, or a sheddable request on a saturated
// fleet). With it, [Queue.Route] holds such a request instead, for at most
// [Config.MaxWait], and routes it when a worker can take it:
//   - requests queue per model (a request's candidates are its model's workers), and a
//     request narrowed to some of them (a GIE subset hint, a stored response's worker)
//     in a queue of its own, so it does not hold back the rest of its model;
//   - the highest priority (its GIE objective's) goes first;
//   - within a priority, the fairness ids (the fairness header's values, as llm-d's
//     x-llm-d-inference-fairness-id) take turns, round robin, so one tenant's burst
//     does not starve another's requests;
//   - within a fairness id, first come first served;
//   - while a model's queue holds requests, a newcomer joins it rather than jumping it;
//     one of a higher priority than every held request is tried at once, as with
//     nothing held (so a queue full of sheddable requests refuses no request a worker
//     can take).
//
// With flow_control.holder_wait, a request waiting for the busy worker that holds its
// session's prompt waits in a queue of that worker's, beside its model's. One
// dispatcher serves a model's queues: it tries their heads, the highest priority
// first, then the oldest, so a freed slot goes by priority whichever queue waits for
// it. At one priority the fairness ids take turns across the queues (a fairness id's
// turn is the group's, not a queue's), then the oldest goes first. A head is tried
// when the router's load ledger changed (a booking, a first token, a release), when it
// became the head, and every retry interval (the engines' metrics and the peers'
// loads change without the ledger), except one waiting for a worker still full: of it
// the router is asked once a retry interval, without a decision, whether it still
// waits (Router.StillWaits). A head refused without a busy worker named waits with the
// requests any worker can take.
// A request that waits past MaxWait, or arrives at a full queue (Config.MaxQueued), is
// refused as before, with an error naming why; a client that goes away leaves the
// queue, and a decision made for it as it left is released.
//
// [Queue] is safe for concurrent use.
package flowcontrol
