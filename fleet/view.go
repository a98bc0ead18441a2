package fleet

import (
	"encoding/json"
	"net/http"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// ViewDeps are where the fleet view reads each worker's state. Every field may be nil:
// its part of the view is then left out.
type ViewDeps struct {
	// Health says whether a worker may be chosen now. *health.Tracker satisfies it.
	Health interface{ Eligible(worker string) bool }
	// Index gives each worker's entry source and footprint. *index.EventIndex
	// satisfies it.
	Index interface {
		Mode(worker string) index.Mode
		Footprints(workers []string, held, capacity []int)
	}
	// Load is this replica's bookings on a worker, and the requests its engine ran
	// beyond every booking at the last scrape. *scoring.Bookings satisfies it.
	Load interface {
		Load(worker string) scoring.Load
		UnseenRequests(worker string) int
	}
	// LoRA gives the scraped adapter slots and the adapters the engine runs.
	// *enginemetrics.Scraper satisfies it.
	LoRA interface {
		MaxLoRAs(worker string) int
		EngineAdapters(worker string) []string
	}
	// ModelLists gives the base models and adapters each engine's model list names.
	// *enginemodels.Lister satisfies it.
	ModelLists interface {
		Models(worker string) (models []string, known bool)
		Adapters(worker string) (adapters []string, known bool)
		ContextLengths(worker string) (contexts map[string]int, known bool)
	}
}

// WorkerView is one worker as this replica sees it, for GET /workers.
type WorkerView struct {
	router.Worker
	// Eligible is false while the worker is out for a health back-off.
	Eligible *bool `json:"eligible,omitempty"`
	// IndexMode is where its index entries come from: events or approximate.
	IndexMode string `json:"index_mode,omitempty"`
	// HeldBlocks and IndexCapacityBlocks are its index footprint and capacity.
	HeldBlocks          *int `json:"held_blocks,omitempty"`
	IndexCapacityBlocks *int `json:"index_capacity_blocks,omitempty"`
	// OffloadedBlocks is what its engine reported in the offload tiers (host memory),
	// when the index keeps them (an *index.EventIndex).
	OffloadedBlocks *int `json:"offloaded_blocks,omitempty"`
	// OffloadChunkBlocks, when the engine's offload tiers hold chunks of several blocks
	// (LMCache's, or vLLM's offloaded blocks k times its GPU's), is their size in
	// blocks: its runs are whole chunks.
	OffloadChunkBlocks int `json:"offload_chunk_blocks,omitempty"`
	// Load is what this replica has booked there (not the peers').
	Load *LoadView `json:"load,omitempty"`
	// ScrapedMaxLoRAs is the engine's max_lora (0: unknown); EngineAdapters the
	// adapters its metrics page said it runs or queues, within lora_residency.
	ScrapedMaxLoRAs int      `json:"scraped_max_loras,omitempty"`
	EngineAdapters  []string `json:"engine_adapters,omitempty"`
	// ListedModels and ListedAdapters are the base models and adapters its engine's
	// model list names; ListKnown says whether that list is known (read, and fresh).
	ListKnown      *bool    `json:"list_known,omitempty"`
	ListedModels   []string `json:"listed_models,omitempty"`
	ListedAdapters []string `json:"listed_adapters,omitempty"`
	// ListedContextLengths are the contexts (max_model_len) its engine's model list
	// gives its models; a configured max_model_len overrides them.
	ListedContextLengths map[string]int `json:"listed_context_lengths,omitempty"`
}

// LoadView is a worker's booked load: P, D, N and W of the cost, and the requests its
// engine ran past kvroute (engine_metrics.unseen_requests), which the cost's N adds.
type LoadView struct {
	PrefillTokens   int `json:"prefill_tokens"`
	ActiveBlocks    int `json:"active_blocks"`
	ActiveRequests  int `json:"active_requests"`
	PendingRequests int `json:"pending_requests"`
	UnseenRequests  int `json:"unseen_requests,omitempty"`
}

// View returns the fleet's state, worker by worker in configured order.
func (f *Fleet) View(deps ViewDeps) []WorkerView {
	workers := f.Workers()
	names := make([]string, len(workers))
	for i, w := range workers {
		names[i] = w.Name
	}
	held, capacity := make([]int, len(workers)), make([]int, len(workers))
	if deps.Index != nil {
		deps.Index.Footprints(names, held, capacity)
	}
	out := make([]WorkerView, len(workers))
	for i, w := range workers {
		v := WorkerView{Worker: w}
		if deps.Health != nil {
			eligible := deps.Health.Eligible(w.Name)
			v.Eligible = &eligible
		}
		if deps.Index != nil {
			v.IndexMode = deps.Index.Mode(w.Name).String()
			v.HeldBlocks, v.IndexCapacityBlocks = &held[i], &capacity[i]
			if o, ok := deps.Index.(interface{ OffloadedEntries(worker string) int }); ok {
				offloaded := o.OffloadedEntries(w.Name)
				v.OffloadedBlocks = &offloaded
			}
			if g, ok := deps.Index.(interface{ OffloadGrain(worker string) int }); ok {
				if chunk := g.OffloadGrain(w.Name); chunk > 1 {
					v.OffloadChunkBlocks = chunk
				}
			}
		}
		if deps.Load != nil {
			l := deps.Load.Load(w.Name)
			v.Load = &LoadView{PrefillTokens: l.PrefillTokens, ActiveBlocks: l.ActiveBlocks, ActiveRequests: l.ActiveRequests, PendingRequests: l.PendingRequests,
				UnseenRequests: deps.Load.UnseenRequests(w.Name)}
		}
		if deps.LoRA != nil {
			v.ScrapedMaxLoRAs, v.EngineAdapters = deps.LoRA.MaxLoRAs(w.Name), deps.LoRA.EngineAdapters(w.Name)
		}
		if deps.ModelLists != nil {
			models, known := deps.ModelLists.Models(w.Name)
			adapters, _ := deps.ModelLists.Adapters(w.Name)
			contexts, _ := deps.ModelLists.ContextLengths(w.Name)
			v.ListKnown, v.ListedModels, v.ListedAdapters, v.ListedContextLengths = &known, models, adapters, contexts
		}
		out[i] = v
	}
	return out
}

// ViewHandler serves GET /workers: {"workers": [WorkerView, …]}, for an operator asking
// why a request went where it did (a worker out, an adapter list unknown, a full
// ledger). It is a read, open like /metrics to whoever reaches the admin port; it
// names the workers' addresses.
func (f *Fleet) ViewHandler(deps ViewDeps) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Workers []WorkerView `json:"workers"`
		}{f.View(deps)})
	})
}
