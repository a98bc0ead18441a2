package scoring

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// LoRABlocked follows vLLM's --max-loras: a worker runs at most max_loras adapters at
// once, and an adapter request waits there until one of them has no request left. A
// request whose adapter is not resident takes a slot, priced by the share in use once
// it has; a full worker adds the requests to wait for.
func TestLoRABlockedCountsWhatAnAdapterRequestWaitsFor(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name     string
		booked   []string // adapters of the requests booked on the worker ("" base)
		released []string // adapters of requests booked then released 5 s ago
		request  string
		maxLoRAs int
		want     float64
	}{
		{"base-model request", []string{"a", "b"}, nil, "", 2, 0},
		{"max_loras unknown", []string{"a", "b"}, nil, "c", 0, 0},
		{"its adapter runs", []string{"a", "b", "b"}, nil, "b", 2, 0},
		{"no adapter runs: it takes one slot of two", []string{"", ""}, nil, "c", 2, 0.5},
		{"the last slot free", []string{"a", "a", ""}, nil, "c", 2, 1},
		{"full: a slot and the fewest requests of a running adapter", []string{"a", "a", "a", "b", "b"}, nil, "c", 2, 3},
		{"full with one adapter", []string{"a", "a"}, nil, "c", 1, 3},
		{"resident after its last request", []string{"a"}, []string{"b"}, "c", 2, 2},
		{"its adapter resident", []string{"a"}, []string{"b"}, "b", 2, 0},
		{"residency over", []string{"a"}, []string{"b"}, "c", 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := start
			residency := time.Minute
			if tt.name == "residency over" {
				residency = 5 * time.Second
			}
			b := NewBookingsResident(residency, func() time.Time { return now })
			for _, lora := range tt.released {
				require.True(t, b.BookAdapter("w", lora, nil, 0).Release())
			}
			now = now.Add(5 * time.Second)
			for _, lora := range tt.booked {
				b.BookAdapter("w", lora, nil, 0)
			}
			c := []Candidate{{Worker: "w", MaxLoRAs: tt.maxLoRAs}, {Worker: "idle", MaxLoRAs: tt.maxLoRAs}}
			b.Fill(c, nil, tt.request)
			assert.Equal(t, tt.want, c[0].LoRABlocked)
			if tt.request != "" && tt.maxLoRAs > 0 {
				assert.Equal(t, 1/float64(tt.maxLoRAs), c[1].LoRABlocked, "a worker with nothing booked has every slot free")
			}
		})
	}
}

// Without residency an adapter leaves the worker's set with its last request, and the
// ledger forgets adapters once their residency is over, so it holds at most the
// adapters used within it.
func TestAdaptersLeaveTheLedger(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, residency := range []time.Duration{0, time.Second} {
		b := NewBookingsResident(residency, func() time.Time { return now })
		for i := range 100 {
			require.True(t, b.BookAdapter("w", string(rune('a'+i%26))+"-adapter", nil, 0).Release())
			now = now.Add(2 * time.Second)
		}
		b.mu.Lock()
		held := len(b.workers["w"].adapters)
		b.mu.Unlock()
		assert.LessOrEqual(t, held, 1, "residency %s", residency)
	}
}

func TestLoRATermPricesTheWait(t *testing.T) {
	p := DefaultParams()
	req := &Request{PromptTokens: 640, BlockSize: 64}
	free := p.Cost(req, Candidate{Worker: "free", MaxLoRAs: 2})
	full := p.Cost(req, Candidate{Worker: "full", MaxLoRAs: 2, LoRABlocked: 3})
	assert.Equal(t, 3*p.LoRAWeight, full.LoRA)
	assert.Equal(t, free.Cost+3*p.LoRAWeight, full.Cost, "the term adds to the cost")
	p.LoRAWeight = 0
	assert.Zero(t, p.Cost(req, Candidate{Worker: "full", MaxLoRAs: 2, LoRABlocked: 3}).LoRA, "0 leaves it out")
}

// Fill, bookings, first tokens, double releases and worker removals from 8 goroutines,
// with adapters going in and out of residency: the ledger ends with no load and no
// adapter active.
func TestAdapterBookingsUnderConcurrentUseReturnToZero(t *testing.T) {
	var clockMu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time {
		clockMu.Lock()
		defer clockMu.Unlock()
		now = now.Add(time.Millisecond)
		return now
	}
	b := NewBookingsResident(50*time.Millisecond, clock)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				w := []string{"a", "b"}[(g+i)%2]
				lora := []string{"", "x", "y", "z"}[(g*7+i)%4]
				c := []Candidate{{Worker: "a", MaxLoRAs: 2}, {Worker: "b", MaxLoRAs: 2}}
				b.Fill(c, []uint64{1, 2}, lora)
				k := b.BookAdapter(w, lora, []uint64{1, 2}, 10)
				if i%3 == 0 {
					b.RemoveWorker(w)
				}
				k.PrefillDone()
				k.Release()
				k.Release()
			}
		})
	}
	wg.Wait()
	for _, w := range []string{"a", "b"} {
		assert.Equal(t, Load{}, b.Load(w))
		b.mu.Lock()
		if l := b.workers[w]; l != nil {
			for name, u := range l.adapters {
				assert.Zero(t, u.active, name)
			}
		}
		b.mu.Unlock()
	}
}

// Other replicas' resident adapters (SetPeerAdapters) count with this ledger's own: an
// adapter resident through a peer costs nothing, peers' adapters take slots, and the
// fewest requests to wait for sum both ledgers'.
func TestPeerAdaptersCountWithTheLedgersOwn(t *testing.T) {
	tests := []struct {
		name    string
		own     []string
		peers   map[string]int
		request string
		want    float64
	}{
		{"resident through a peer", nil, map[string]int{"sql": 0}, "sql", 0},
		{"a peer's adapter takes a slot", nil, map[string]int{"sql": 1}, "chat", 1},
		{"peers fill the slots", []string{"a"}, map[string]int{"b": 3}, "c", 2},
		{"requests of one adapter through both", []string{"a", "a"}, map[string]int{"a": 3, "b": 4}, "c", 5},
		{"an idle adapter through a peer still holds a slot", []string{"a"}, map[string]int{"b": 0}, "c", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBookingsResident(time.Minute, nil)
			for _, lora := range tt.own {
				b.BookAdapter("w", lora, nil, 0)
			}
			b.SetPeerAdapters("w", tt.peers)
			c := []Candidate{{Worker: "w", MaxLoRAs: 2}}
			b.Fill(c, nil, tt.request)
			assert.Equal(t, tt.want, c[0].LoRABlocked)
			b.SetPeerAdapters("w", nil)
			b.Fill(c, nil, tt.request)
			assert.Equal(t, float64(len(uniq(tt.own))+1)/2, c[0].LoRABlocked, "forgotten with an empty map")
		})
	}
}

func uniq(names []string) map[string]bool {
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out
}

// The adapters a worker's engine reports running or queued count as resident there
// with the ledger's own and the peers', each once: an engine also runs requests this
// router did not book (another replica without peers, direct traffic, requests from
// before a restart).
func TestEngineAdaptersCountWithTheLedgersOwn(t *testing.T) {
	tests := []struct {
		name    string
		own     []string
		peers   map[string]int
		engine  []string
		request string
		want    float64
	}{
		{"resident through the engine", nil, nil, []string{"sql"}, "sql", 0},
		{"the engine's adapter takes a slot", nil, nil, []string{"sql"}, "chat", 1},
		{"the engine fills the slots: one request to wait for", nil, nil, []string{"a", "b"}, "c", 2},
		{"an adapter booked here and reported counts once", []string{"a"}, nil, []string{"a"}, "c", 1},
		{"an adapter of a peer and reported counts once", nil, map[string]int{"a": 2}, []string{"a"}, "c", 1},
		{"own and engine fill the slots: the fewest requests", []string{"a", "a", "a"}, nil, []string{"a", "b"}, "c", 2},
		{"own, peers and engine", []string{"a"}, map[string]int{"b": 3}, []string{"e"}, "c", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBookingsResident(time.Minute, nil)
			for _, lora := range tt.own {
				b.BookAdapter("w", lora, nil, 0)
			}
			b.SetPeerAdapters("w", tt.peers)
			c := []Candidate{{Worker: "w", MaxLoRAs: 2, EngineAdapters: tt.engine}}
			b.Fill(c, nil, tt.request)
			assert.Equal(t, tt.want, c[0].LoRABlocked)
		})
	}
}
