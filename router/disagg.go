package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scoring"
)

// Why a request in a fleet with prefill workers was prefilled by its destination
// (Decision.DecodeOnly).
const (
	// DecodeOnlyUnderThreshold: the destination misses fewer prompt tokens than the
	// policy's disaggregate_tokens (a resumed session on its decode worker).
	DecodeOnlyUnderThreshold = "under_threshold"
	// DecodeOnlyNoPrefillWorker: every prefill worker serving the model is out for a
	// health back-off or at max_active_requests_per_worker, or, for a sheddable
	// request, has no capacity.
	DecodeOnlyNoPrefillWorker = "no_prefill_worker"
	// DecodeOnlyWholeAPI: the request's API is one the routing sidecar does not split
	// (Request.Whole).
	DecodeOnlyWholeAPI = "whole_api"
)

// Prefill is the prefill worker of a disaggregated request and the booking it holds
// there until the destination's first token.
type Prefill struct {
	// Decision is the prefill workers' pick: Worker names the chosen one, Terms every
	// prefill candidate's cost terms (the explain trace).
	scoring.Decision
	// Address is the prefill worker's ip:port, for the prefill header.
	Address string
	// FallbackAddresses are the other prefill candidates' addresses, best first (the
	// explain trace: the routing sidecar takes one prefill worker).
	FallbackAddresses []string
	// PredictedCachedTokens is the prefill worker's overlap in tokens.
	PredictedCachedTokens int

	booking *scoring.Booking
	worker  Worker // the chosen prefill worker, whose context caps its booked prefill
}

// prefillScratch holds the prefill candidates' buffers of one decision.
type prefillScratch struct {
	candidates []Worker
	names      []string
	scored     []scoring.Candidate
	ints       []int
}

// split is how a decision divides a request between a prefill worker and the
// destination.
type split struct {
	prefill    *Prefill
	decodeOnly string
	missing    int
}

// params returns the cost parameters in force for a decision's sreq: its route's
// override, else the policy's as Route read it once for the decision
// (scoring.DefaultParams' without a policy). The router reads the ones the picker does
// not apply for it: disaggregate_tokens and prefill_history_half_life.
func (r *Router) params(sreq *scoring.Request) scoring.Params {
	if sreq.Params != nil {
		return *sreq.Params
	}
	return scoring.DefaultParams()
}

// computedTokens is the prompt tokens the candidate t would compute for a prompt of
// promptTokens, its booked share of P: what it does not hold, less the offloaded blocks
// it would load as the picker's cost counted them (Terms.LoadCredit: u·o(w) blocks; 0
// for pickers without the credit, and for u = 0, Dynamo's cost, which books every
// loaded token as prefill). The one formula for a destination, a prefill worker and a
// fallback that served.
func computedTokens(promptTokens int, t scoring.Terms, blockSize int) int {
	return promptTokens - t.Overlap*blockSize - int(math.Round(t.LoadCredit*float64(blockSize)))
}

// wholeSplit is the split of a request its sidecar passes on whole (Request.Whole):
// the destination prefills the missing tokens itself.
func wholeSplit(missing int) split {
	return split{missing: missing, decodeOnly: DecodeOnlyWholeAPI}
}

// splitPrefill decides, under the decision lock and after the destination was picked,
// whether a prefill worker computes the prompt: when the destination misses at least
// disaggregate_tokens of it (and at least one), the prefill workers in sc are priced
// by the same picker and cost as destinations (their overlap, pending prefill and
// load), and the cheapest is chosen. missing is the prompt tokens the destination
// does not hold; sheddable says the request's priority is below 0, and then only the
// prefill workers with capacity (priority.Saturation) are priced.
func (r *Router) splitPrefill(ctx context.Context, req *Request, sreq *scoring.Request, sc *prefillScratch, blocks []uint64, missing int, sheddable bool) (split, error) {
	out := split{missing: missing}
	if missing <= 0 || float64(missing) < r.params(sreq).DisaggregateTokens {
		out.decodeOnly = DecodeOnlyUnderThreshold
		return out, nil
	}
	candidates := sc.candidates
	if len(candidates) == 0 {
		out.decodeOnly = DecodeOnlyNoPrefillWorker
		return out, nil
	}
	names := slices.Grow(sc.names[:0], len(candidates))[:len(candidates)]
	sc.names = names
	scored := slices.Grow(sc.scored[:0], len(candidates))[:len(candidates)]
	sc.scored = scored
	clear(scored)
	for i, c := range candidates {
		names[i] = c.Name
		r.describe(&scored[i], c, req.LoRA)
	}
	r.lookUp(&sc.ints, blocks, names, scored)
	// A prefill worker runs the request's adapter too, in its own slots.
	r.deps.Bookings.Fill(scored, blocks, req.LoRA)
	if r.maxActive > 0 {
		// Shed as destinations are shed; with every prefill worker full, the
		// destination prefills (a slower request, not a refused one).
		kept := 0
		for i := range scored {
			if scored[i].ActiveRequests < r.maxActive {
				scored[kept], candidates[kept] = scored[i], candidates[i]
				kept++
			}
		}
		if kept == 0 {
			out.decodeOnly = DecodeOnlyNoPrefillWorker
			return out, nil
		}
		scored, candidates = scored[:kept], candidates[:kept]
	}
	if sheddable {
		// A sheddable request's prompt goes only where there is capacity, as its
		// destination did; with none, the destination prefills it.
		kept := r.keepCapacity(scored, candidates)
		if kept == 0 {
			out.decodeOnly = DecodeOnlyNoPrefillWorker
			return out, nil
		}
		scored, candidates = scored[:kept], candidates[:kept]
	}
	picker := r.deps.PrefillPicker
	if picker == nil {
		picker = r.deps.Picker
	}
	picked, err := picker.Pick(ctx, sreq, scored)
	if err != nil {
		var fe *scoring.FieldError
		if errors.As(err, &fe) {
			return out, fmt.Errorf("%w: policy override %v", ErrBadRequest, err)
		}
		return out, fmt.Errorf("router: pick the prefill worker: %w", err)
	}
	chosen := candidates[picked.Chosen]
	fallbacks := make([]string, len(picked.Fallbacks))
	for i, c := range picked.Fallbacks {
		fallbacks[i] = candidates[c].Address
	}
	out.prefill = &Prefill{Decision: picked, Address: chosen.Address, FallbackAddresses: fallbacks,
		PredictedCachedTokens: picked.Terms[picked.Chosen].Overlap * r.blockSize, worker: chosen}
	return out, nil
}

// describe fills what a candidate is before its load and overlap: its name, batch and
// adapter slots, and what its engine says of itself (queue, KV usage, the adapter).
func (r *Router) describe(dst *scoring.Candidate, w Worker, lora string) {
	dst.Worker, dst.MaxNumSeqs, dst.MaxLoRAs = w.Name, w.MaxNumSeqs, w.MaxLoRAs
	if w.MaxLoRAs == 0 && lora != "" && r.deps.LoRASlots != nil {
		dst.MaxLoRAs = r.deps.LoRASlots.MaxLoRAs(w.Name)
	}
	if lora != "" && r.deps.EngineAdapters != nil {
		dst.EngineAdapters = r.deps.EngineAdapters.EngineAdapters(w.Name)
	}
	if lora != "" && r.deps.LoRAStates != nil {
		dst.EngineLoRA = r.deps.LoRAStates.LoRAState(w.Name, lora)
	}
	if r.deps.Signals != nil {
		dst.Waiting, dst.KVUtilization = r.deps.Signals.Signals(w.Name)
	}
}

// record stores a decision's blocks on worker, chosen at address, when the router
// records them. Called under decideMu. The decision stands whatever changed since its
// candidates were read (the worker was in the fleet then); only its blocks may go
// unrecorded:
//   - a worker since moved to another address is another engine, cleared by
//     SetWorkers: it computes none of these blocks;
//   - a worker since removed is not in the index. The fleet forgets the router's
//     worker before the ledger's, but may have done both before this decision booked
//     it, which made it anew in the ledger: it is marked departed again, so that its
//     last release forgets it (else its name stays in the ledger, and in the load
//     reported to peers, for good).
func (r *Router) record(worker, address string, blocks []uint64, session string) error {
	if r.departed(worker) {
		return nil
	}
	if !r.deps.RecordBlocks || r.addresses[worker] != address {
		return nil
	}
	if err := r.deps.Index.Store(worker, blocks); err != nil {
		if !errors.Is(err, index.ErrUnknownWorker) {
			return fmt.Errorf("router: record blocks: %w", err)
		}
		r.deps.Bookings.RemoveWorker(worker)
		return nil
	}
	if r.deps.Records != nil && (len(blocks) > 0 || session != "") { // else nothing to tell
		r.deps.Records.Recorded(worker, address, blocks, session)
	}
	return nil
}

// departed reports whether worker has left the fleet since the decision booked it,
// and if so marks it departed in the ledger again (record says why). Called under
// decideMu, by every decision that booked a worker, whether it records or not.
func (r *Router) departed(worker string) bool {
	if _, inFleet := r.addresses[worker]; inFleet {
		return false
	}
	r.deps.Bookings.RemoveWorker(worker)
	return true
}

// undo takes back what a decision that failed after booking had done: no worker is
// sent its request, so its bookings are cancelled (their prefill leaves the workers'
// prefill history) and the blocks it recorded beyond each worker's overlap are
// forgotten (blocks an engine reported stay).
func (r *Router) undo(booking *scoring.Booking, prefill *Prefill, recorded []recordedBlocks) {
	booking.Cancel()
	if prefill != nil && prefill.booking != nil {
		prefill.booking.Cancel()
	}
	for _, rec := range recorded {
		// Best effort: the decision is failing already, and an index that cannot forget
		// them (a worker removed meanwhile) holds the blocks until its TTL or capacity.
		_ = r.deps.Index.Unrecord(rec.worker, rec.blocks)
	}
}

// recordedBlocks is what a decision recorded on a worker that it did not hold.
type recordedBlocks struct {
	worker string
	blocks []uint64
}
