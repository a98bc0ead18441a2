package fleet

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

type outOf map[string]bool

func (o outOf) Eligible(worker string) bool { return !o[worker] }

type loraState struct {
	slots   map[string]int
	running map[string][]string
}

func (l loraState) MaxLoRAs(worker string) int            { return l.slots[worker] }
func (l loraState) EngineAdapters(worker string) []string { return l.running[worker] }

// lists is engine model lists: worker → its base models and adapters.
type lists map[string]struct {
	models, adapters []string
	contexts         map[string]int
}

func (l lists) Models(worker string) ([]string, bool)   { li, ok := l[worker]; return li.models, ok }
func (l lists) Adapters(worker string) ([]string, bool) { li, ok := l[worker]; return li.adapters, ok }
func (l lists) ContextLengths(worker string) (map[string]int, bool) {
	li, ok := l[worker]
	return li.contexts, ok
}

// GET /workers answers each worker as this replica sees it, in configured order: its
// config, health, index source and footprint, booked load, and LoRA state (slots,
// the adapters its engine runs, and what its model list names, if known).
func TestViewHandlerAnswersEachWorkersState(t *testing.T) {
	idx, err := index.NewEventIndex(indexConfig(), nil)
	require.NoError(t, err)
	workers := []router.Worker{
		{Name: "w0", Address: "10.0.0.1:8000", Models: []string{"qwen"}, MaxLoRAs: 2, LoRAAdapters: nil},
		{Name: "w1", Address: "10.0.0.2:8000", Role: router.RolePrefill},
	}
	f, err := New(workers, Deps{Index: idx, Router: &recorder{}})
	require.NoError(t, err)
	require.NoError(t, idx.Store("w0", []uint64{1, 2, 3}))
	require.NoError(t, idx.OffloadStored("w0", []uint64{1, 2, 3, 4}))
	idx.SetOffloadGrain("w0", 4, true) // LMCache's chunks
	bookings := scoring.NewBookings()
	booking := bookings.Book("w0", []uint64{1, 2}, 128)
	defer booking.Release()
	bookings.SetEngineRequests("w0", 4) // 3 past kvroute

	srv := httptest.NewServer(f.ViewHandler(ViewDeps{Health: outOf{"w1": true}, Index: idx, Load: bookings,
		LoRA:       loraState{slots: map[string]int{"w0": 4}, running: map[string][]string{"w0": {"sql"}}},
		ModelLists: lists{"w0": {models: []string{"qwen"}, adapters: []string{"chat", "sql"}, contexts: map[string]int{"qwen": 32768}}}}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var got struct {
		Workers []map[string]any `json:"workers"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	require.Len(t, got.Workers, 2)
	w0, w1 := got.Workers[0], got.Workers[1]
	assert.Equal(t, map[string]any{
		"name": "w0", "address": "10.0.0.1:8000", "models": []any{"qwen"}, "max_loras": 2.0,
		"eligible": true, "index_mode": "approximate", "held_blocks": 3.0, "index_capacity_blocks": 100.0, "offloaded_blocks": 4.0, "offload_chunk_blocks": 4.0,
		"load":              map[string]any{"prefill_tokens": 128.0, "active_blocks": 2.0, "active_requests": 1.0, "pending_requests": 1.0, "unseen_requests": 3.0},
		"scraped_max_loras": 4.0, "engine_adapters": []any{"sql"}, "list_known": true, "listed_models": []any{"qwen"}, "listed_adapters": []any{"chat", "sql"},
		"listed_context_lengths": map[string]any{"qwen": 32768.0},
	}, w0)
	assert.Equal(t, false, w1["eligible"])
	assert.Equal(t, "prefill", w1["role"])
	assert.Equal(t, false, w1["list_known"], "no list read")
	assert.NotContains(t, w1, "listed_adapters")
	assert.NotContains(t, w1, "listed_models")
}

// Without any source the view is the workers' config alone.
func TestViewWithoutSourcesIsTheConfig(t *testing.T) {
	idx, err := index.NewEventIndex(indexConfig(), nil)
	require.NoError(t, err)
	workers := []router.Worker{{Name: "w0", Address: "10.0.0.1:8000"}}
	f, err := New(workers, Deps{Index: idx, Router: &recorder{}})
	require.NoError(t, err)
	assert.Equal(t, []WorkerView{{Worker: workers[0]}}, f.View(ViewDeps{}))
}

func indexConfig() index.Config {
	cfg := index.DefaultConfig()
	cfg.CapacityBlocks = 100
	return cfg
}
