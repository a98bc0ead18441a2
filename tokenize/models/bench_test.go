package models_test

import (
	"runtime"
	"testing"

	"github.com/kvroute/kvroute/tokenize/models"
)

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkLoadDefault loads what extproc loads with no tokenizers section (the
// embedded Qwen3 tokenizer and its chat template) and reports the live heap the set
// holds, its segment memo empty.
func BenchmarkLoadDefault(b *testing.B) {
	var heap uint64
	for b.Loop() {
		before := liveHeap()
		s, err := models.Load(nil, models.Deps{})
		if err != nil {
			b.Fatal(err)
		}
		heap = liveHeap() - before
		runtime.KeepAlive(s)
	}
	b.ReportMetric(float64(heap)/(1<<20), "MB-live-heap")
}

// BenchmarkLoadDeferredDefault loads what extproc loads when every worker lists its
// models and each has an entry (here one approx entry): the embedded default is
// deferred, so neither its load time nor its heap is paid at start.
func BenchmarkLoadDeferredDefault(b *testing.B) {
	var heap uint64
	for b.Loop() {
		before := liveHeap()
		s, err := models.Load(models.Config{"m": {Approx: true}}, models.Deps{DeferDefault: true})
		if err != nil {
			b.Fatal(err)
		}
		heap = liveHeap() - before
		runtime.KeepAlive(s)
	}
	b.ReportMetric(float64(heap)/(1<<20), "MB-live-heap")
}
