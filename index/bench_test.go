package index

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"
)

func BenchmarkBlockHashes4096Tokens(b *testing.B) {
	tokens := seq(1, 4096)
	dst := make([]uint64, 0, 64)
	salt := Salt("Qwen/Qwen3-8B", "", "")
	b.SetBytes(int64(len(tokens) * 4))
	for b.Loop() {
		dst = BlockHashes(dst[:0], tokens, 64, salt)
	}
}

// fleet builds an index of 64 workers × 16,384 blocks (1,048,576 entries): each worker
// is sent 300 prompts of 64 blocks (its LRU keeps the newest 16,384 blocks) whose first
// 8 blocks are a system prompt shared by the whole fleet, so every lookup walks at least
// 8 blocks with all 64 workers alive.
func fleet(b *testing.B) (*Index, []string, []uint64) {
	b.Helper()
	x, err := New(Config{CapacityBlocks: 16384}, nil)
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, 64)
	var query []uint64
	for w := range names {
		names[w] = fmt.Sprintf("worker-%02d", w)
		if err := x.SetWorker(names[w], 0); err != nil {
			b.Fatal(err)
		}
		for p := range 300 {
			tail := make([]uint32, 56*64)
			for i := range tail {
				tail[i] = uint32(1_000_000 + (w*300+p)*len(tail) + i)
			}
			chain := BlockHashes(nil, append(seq(0, 8*64), tail...), 64, 1)
			if w == 0 && p == 299 {
				query = chain
			}
			if err := x.Store(names[w], chain); err != nil {
				b.Fatal(err)
			}
		}
	}
	if x.Entries() != 64*16384 {
		b.Fatalf("fleet holds %d entries", x.Entries())
	}
	return x, names, query
}

func BenchmarkOverlaps64Workers1MEntries(b *testing.B) {
	x, names, query := fleet(b)
	dst := make([]int, len(names))
	for b.Loop() {
		x.Overlaps(query, names, dst)
	}
	if dst[0] != 64 || dst[1] != 8 {
		b.Fatalf("overlaps %v", dst[:2])
	}
}

// BenchmarkBytesPerEntry reports heap bytes per stored (block, worker) entry for a
// fleet where every block is held by one worker (the costliest case: nothing in the
// shared hash map is amortised over several workers).
func BenchmarkBytesPerEntry(b *testing.B) {
	for b.Loop() {
		const workers, perWorker = 16, 65536
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		x, _ := New(Config{CapacityBlocks: perWorker}, nil)
		chain := make([]uint64, 64)
		for w := range workers {
			name := fmt.Sprint("w", w)
			_ = x.SetWorker(name, 0)
			for p := range perWorker / 64 {
				for i := range chain {
					chain[i] = uint64((w*perWorker+p*64+i)+1) * 0x9E3779B97F4A7C15
				}
				_ = x.Store(name, chain)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(x.Entries()), "bytes/entry")
		runtime.KeepAlive(x)
	}
}

// BenchmarkEventIndexOverlaps64Workers1MEntries is BenchmarkOverlaps64Workers1MEntries
// through an EventIndex whose workers are all approximate (what kvroute serves when no
// worker has kv_events): the walk of the empty confirmed part is the added cost.
func BenchmarkEventIndexOverlaps64Workers1MEntries(b *testing.B) {
	x, names, query := fleet(b)
	ev, err := NewEventIndex(Config{CapacityBlocks: 16384, PendingTTL: time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ev.recorded = x // the same 1M entries, as decisions recorded on approximate workers
	for _, n := range names {
		if err := ev.confirmed.SetWorker(n, 0); err != nil {
			b.Fatal(err)
		}
	}
	dst := make([]int, len(names))
	for b.Loop() {
		ev.Overlaps(query, names, dst)
	}
	if dst[0] != 64 || dst[1] != 8 {
		b.Fatalf("overlaps %v", dst[:2])
	}
}

// BenchmarkEventIndexOffloaded64Workers1MEntries is the offloaded-run lookup of a
// decision when every worker's engine offloads (kv_events.offload_tiers): the 1M
// entries of BenchmarkOverlaps64Workers1MEntries as the workers' host blocks, each
// worker's walk starting at a device overlap of 0 (a prompt the devices evicted).
func BenchmarkEventIndexOffloaded64Workers1MEntries(b *testing.B) {
	benchmarkOffloaded(b, 1)
}

// BenchmarkEventIndexOffloaded64Workers1MEntriesChunks is the same lookup when every
// worker's host holds chunks of 4 blocks (LMCache's, SetOffloadGrain): each run is then
// cut to whole chunks.
func BenchmarkEventIndexOffloaded64Workers1MEntriesChunks(b *testing.B) {
	benchmarkOffloaded(b, 4)
}

func benchmarkOffloaded(b *testing.B, grain int) {
	x, names, query := fleet(b)
	ev, err := NewEventIndex(Config{CapacityBlocks: 16384, PendingTTL: time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ev.offloaded = x
	for _, n := range names {
		ev.SetOffloadGrain(n, grain, true)
	}
	from, dst := make([]int, len(names)), make([]int, len(names))
	for b.Loop() {
		ev.Offloaded(query, names, from, dst)
	}
	if dst[0] != 64 || dst[1] != 8 {
		b.Fatalf("offloaded runs %v", dst[:2])
	}
}

// BenchmarkStoreResumedTurn is the approximate index's record of one decision on a
// full worker of a 64 × 16,384-entry fleet: a resumed conversation whose 64 blocks the
// worker holds, plus 22 blocks it has never seen, which evict its 22 oldest.
func BenchmarkStoreResumedTurn(b *testing.B) {
	x, names, query := fleet(b)
	hashes := append(slices.Clone(query), make([]uint64, 22)...)
	next := uint64(1)
	for b.Loop() {
		for i := len(query); i < len(hashes); i++ {
			hashes[i] = next * 0x9E3779B97F4A7C15
			next++
		}
		if err := x.Store(names[0], hashes); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTouchRun64Blocks is what a decision adds on a worker whose host memory
// holds its prompt (EventIndex.Store refreshes the offloaded run it finds): a
// 64-block run touched among 1M entries.
func BenchmarkTouchRun64Blocks(b *testing.B) {
	x, names, query := fleet(b)
	for b.Loop() {
		x.TouchRun(names[0], query)
	}
}
