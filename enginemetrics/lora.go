package enginemetrics

import (
	"bytes"
	"fmt"
	"math"
	"slices"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vLLM reports its LoRA configuration and adapters on one gauge, whose value is the
// time of the last update: max_lora is its --max-loras, the adapters one batch runs.
const (
	loraInfoMetric = "vllm:lora_requests_info"
	maxLoRALabel   = "max_lora"
)

// MaxScrapedLoRAs bounds a scraped max_lora: vLLM keeps a GPU slot per adapter, and no
// engine runs thousands at once.
const MaxScrapedLoRAs = 4096

// ParseMaxLoRAs reads how many LoRA adapters an engine runs at once from its metrics
// page: the max_lora label of vllm:lora_requests_info (of its latest series, when
// several are left from changing adapter lists). An engine without LoRA has no such
// series: 0 and no error. The page is hostile: a value must be a whole number in
// [1, MaxScrapedLoRAs].
func ParseMaxLoRAs(page []byte) (int, error) {
	lines := linesOf(page, loraInfoMetric)
	if len(lines) == 0 {
		return 0, nil
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(lines))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", loraInfoMetric, err)
	}
	f, ok := families[loraInfoMetric]
	if !ok || len(f.GetMetric()) == 0 {
		return 0, nil
	}
	best, latest := 0, math.Inf(-1)
	for _, m := range f.GetMetric() {
		v, ok := labelValue(m, maxLoRALabel)
		if !ok {
			return 0, fmt.Errorf("%s: no label %s", loraInfoMetric, maxLoRALabel)
		}
		n, err := wholeNumber(v)
		if err != nil || n < 1 || n > MaxScrapedLoRAs {
			return 0, fmt.Errorf("%s: label %s=%q: want a whole number in [1, %d]", loraInfoMetric, maxLoRALabel, v, MaxScrapedLoRAs)
		}
		at := m.GetGauge().GetValue()
		if m.GetGauge() == nil {
			at = m.GetUntyped().GetValue()
		}
		if math.IsNaN(at) {
			at = math.Inf(-1)
		}
		if best == 0 || at > latest {
			best, latest = int(n), at
		}
	}
	return best, nil
}

// MaxLoRAs returns how many LoRA adapters the worker's engine runs at once, as its page
// said last (0: unknown, or LoRA off). The router reads it for a worker without
// max_loras.
func (s *Scraper) MaxLoRAs(worker string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loraSlots[worker]
}

// readMaxLoRAs reads w's max_lora from its page. An unreadable value is logged once per
// change of error and leaves the worker unknown (0): the cost then leaves adapter slots
// out, as without LoRA.
func (s *Scraper) readMaxLoRAs(w Worker, page []byte) {
	n, err := ParseMaxLoRAs(page)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.workers, w) { // removed or moved while this scrape ran
		return
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if err != nil && s.loraErr[w.Name] != msg {
		s.log.Warn("engine max_lora unreadable: the worker's adapter slots are unknown (set workers[].max_loras)", "worker", w.Name, "error", err)
	}
	if msg == "" {
		delete(s.loraErr, w.Name)
	} else {
		s.loraErr[w.Name] = msg
	}
	if n > 0 {
		s.loraSlots[w.Name] = n
	} else {
		delete(s.loraSlots, w.Name)
	}
}
