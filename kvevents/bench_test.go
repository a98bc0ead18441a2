package kvevents

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/index"
)

// steadyStream is an engine at steady state: every batch stores one new 16-block
// sequence (block size 16, token ids up to 150,000 as a real vocabulary's) and evicts
// the sequence stored `live` batches earlier. It returns the payloads, cycling cleanly
// (payload i removes what payload i−live stored, modulo n).
func steadyStream(b *testing.B, n, live, blocks, bs int, form Form) [][]byte {
	b.Helper()
	hashesOf := func(seq int) []uint64 {
		out := make([]uint64, blocks)
		for i := range out {
			out[i] = uint64(seq*blocks+i+1) * 0x9E3779B97F4A7C15
		}
		return out
	}
	payloads := make([][]byte, n)
	for seq := range n {
		tokens := make([]uint32, blocks*bs)
		for i := range tokens {
			tokens[i] = uint32((seq*7919 + i*104729) % 150_000)
		}
		batch := &Batch{TS: 1, Events: []Event{
			{Type: TypeBlockStored, BlockHashes: hashesOf(seq), TokenIDs: tokens, BlockSize: bs, Medium: "GPU"},
			{Type: TypeBlockRemoved, BlockHashes: hashesOf((seq - live + n) % n), Medium: "GPU"},
		}}
		p, err := Encode(batch, form)
		if err != nil {
			b.Fatal(err)
		}
		payloads[seq] = p
	}
	return payloads
}

// BenchmarkIngest measures one worker's event ingest: decode, recompute the own hashes
// from token ids, update the engine-hash map and the index. It reports block events
// (blocks stored plus blocks removed) per second. Run it on one core: -cpu 1.
func BenchmarkIngest(b *testing.B) {
	for _, form := range []Form{FormMap, FormArray} {
		b.Run(map[Form]string{FormMap: "map", FormArray: "array"}[form], func(b *testing.B) {
			const n, live, blocks, bs = 4096, 512, 16, 16
			payloads := steadyStream(b, n, live, blocks, bs, form)
			idx, err := index.NewEventIndex(index.Config{CapacityBlocks: 2 * live * blocks, TTL: time.Minute, PendingTTL: time.Second}, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := idx.SetWorker("w", 0); err != nil {
				b.Fatal(err)
			}
			a := NewApplier(WorkerSpec{Name: "w", Model: "m", BlockSize: bs, Ranks: 1, MaxEntries: 4 * live * blocks}, DefaultConfig(), idx, nil, nil)
			for _, p := range payloads { // warm: reach the steady state
				if err := a.Apply(0, p); err != nil {
					b.Fatal(err)
				}
			}
			var bytes int
			for _, p := range payloads {
				bytes += len(p)
			}
			b.SetBytes(int64(bytes / n))
			b.ResetTimer()
			cpu := cpuTime()
			i := 0
			for b.Loop() {
				if err := a.Apply(0, payloads[i%n]); err != nil {
					b.Fatal(err)
				}
				i++
			}
			cpu = cpuTime() - cpu
			b.ReportMetric(float64(2*blocks*b.N)/b.Elapsed().Seconds(), "block-events/s")
			// On a shared machine wall time counts other processes' turns too; the
			// process's own CPU time (GC included) does not.
			b.ReportMetric(float64(2*blocks*b.N)/cpu.Seconds(), "block-events/cpu-s")
			if got := a.Entries(); got != live*blocks {
				b.Fatalf("steady state holds %d entries, want %d", got, live*blocks)
			}
		})
	}
}

// cpuTime is the process's user plus system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIndexMemory64Workers32KBlocks reports the live heap of an event index
// holding 64 workers × 32,768 engine-reported blocks (2,097,152 (block, worker)
// entries, nothing shared between workers: the costliest case), including every
// worker's engine-hash map.
func BenchmarkIndexMemory64Workers32KBlocks(b *testing.B) {
	const workers, perWorker, blocks, bs = 64, 32768, 16, 16
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		idx, err := index.NewEventIndex(index.Config{CapacityBlocks: perWorker, TTL: time.Minute, PendingTTL: time.Second}, nil)
		if err != nil {
			b.Fatal(err)
		}
		appliers := make([]*Applier, workers)
		tokens := make([]uint32, blocks*bs)
		hashes := make([]uint64, blocks)
		for w := range workers {
			name := fmt.Sprint("w", w)
			if err := idx.SetWorker(name, 0); err != nil {
				b.Fatal(err)
			}
			appliers[w] = NewApplier(WorkerSpec{Name: name, Model: "m", BlockSize: bs, Ranks: 1, MaxEntries: 2 * perWorker}, DefaultConfig(), idx, nil, nil)
			for seq := range perWorker / blocks {
				for i := range tokens {
					tokens[i] = uint32(w*perWorker*bs + seq*blocks*bs + i)
				}
				for i := range hashes {
					hashes[i] = uint64(w*perWorker+seq*blocks+i+1) * 0x9E3779B97F4A7C15
				}
				p, err := Encode(&Batch{Events: []Event{{Type: TypeBlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: bs}}}, FormArray)
				if err != nil {
					b.Fatal(err)
				}
				if err := appliers[w].Apply(0, p); err != nil {
					b.Fatal(err)
				}
			}
		}
		for _, a := range appliers {
			a.dec = NewDecoder() // drop the decoders' scratch buffers: not index memory
			a.own, a.gone = nil, [tierOffloaded + 1][]uint64{}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		confirmed, _ := idx.Entries()
		if confirmed != workers*perWorker {
			b.Fatalf("index holds %d entries", confirmed)
		}
		heap := float64(after.HeapAlloc - before.HeapAlloc)
		b.ReportMetric(heap/(1<<20), "MiB")
		b.ReportMetric(heap/float64(confirmed), "bytes/entry")
		runtime.KeepAlive(appliers)
	}
}
