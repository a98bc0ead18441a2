package enginemetrics

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/enginename"
	"github.com/kvroute/kvroute/scoring"

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

// LoRAInfo is what an engine's vllm:lora_requests_info says.
type LoRAInfo struct {
	// MaxLoRAs is its --max-loras (0: LoRA off, no series).
	MaxLoRAs int
	// Running and Waiting are the adapters of its running and of its waiting requests
	// (running_lora_adapters and waiting_lora_adapters), each once.
	Running, Waiting []string
}

// Adapters returns the running adapters, then the waiting ones not running, each once.
func (i LoRAInfo) Adapters() []string {
	if len(i.Waiting) == 0 {
		return i.Running
	}
	running := make(map[string]bool, len(i.Running))
	for _, name := range i.Running {
		running[name] = true
	}
	out := slices.Clip(i.Running)
	for _, name := range i.Waiting {
		if !running[name] {
			out = append(out, name)
		}
	}
	return out
}

// Labels of vllm:lora_requests_info naming adapters, comma-separated.
const (
	runningLoRAsLabel = "running_lora_adapters"
	waitingLoRAsLabel = "waiting_lora_adapters"
)

// ParseLoRAInfo reads the engine's LoRA slots and the adapters it runs and queues from
// its metrics page: the labels of vllm:lora_requests_info (of its latest series, when
// several are left from changing adapter lists). An engine without LoRA has no such
// series: a zero LoRAInfo and no error. The page is hostile: max_lora must be a whole
// number in [1, MaxScrapedLoRAs]; the adapter lists name at most MaxScrapedLoRAs
// adapters together, each a name enginename.Check accepts.
// On an error the whole LoRAInfo is zero.
func ParseLoRAInfo(page []byte) (LoRAInfo, error) {
	lines := linesOf(page, loraInfoMetric)
	if len(lines) == 0 {
		return LoRAInfo{}, nil
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(lines))
	if err != nil {
		return LoRAInfo{}, fmt.Errorf("%s: %w", loraInfoMetric, err)
	}
	f, ok := families[loraInfoMetric]
	if !ok || len(f.GetMetric()) == 0 {
		return LoRAInfo{}, nil
	}
	var best *dto.Metric
	slots, latest := 0, math.Inf(-1)
	for _, m := range f.GetMetric() {
		v, ok := labelValue(m, maxLoRALabel)
		if !ok {
			return LoRAInfo{}, fmt.Errorf("%s: no label %s", loraInfoMetric, maxLoRALabel)
		}
		n, err := wholeNumber(v)
		if err != nil || n < 1 || n > MaxScrapedLoRAs {
			return LoRAInfo{}, fmt.Errorf("%s: label %s=%q: want a whole number in [1, %d]", loraInfoMetric, maxLoRALabel, v, MaxScrapedLoRAs)
		}
		at := m.GetGauge().GetValue()
		if m.GetGauge() == nil {
			at = m.GetUntyped().GetValue()
		}
		if math.IsNaN(at) {
			at = math.Inf(-1)
		}
		if best == nil || at > latest {
			best, slots, latest = m, int(n), at
		}
	}
	info := LoRAInfo{MaxLoRAs: slots}
	named := 0
	seen := map[string]bool{} // per list; a set, as a page may name thousands
	for _, l := range []struct {
		label string
		dst   *[]string
	}{{runningLoRAsLabel, &info.Running}, {waitingLoRAsLabel, &info.Waiting}} {
		v, _ := labelValue(best, l.label)
		clear(seen)
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name == "" || seen[name] {
				continue
			}
			seen[name] = true
			if err := enginename.Check(name); err != nil {
				return LoRAInfo{}, fmt.Errorf("%s: label %s: an adapter name: %w", loraInfoMetric, l.label, err)
			}
			if named++; named > MaxScrapedLoRAs {
				return LoRAInfo{}, fmt.Errorf("%s: more than %d adapters named", loraInfoMetric, MaxScrapedLoRAs)
			}
			*l.dst = append(*l.dst, name)
		}
	}
	return info, nil
}

// MaxLoRAs returns how many LoRA adapters the worker's engine runs at once, as its page
// said last (0: unknown, or LoRA off). The router reads it for a worker without
// max_loras.
func (s *Scraper) MaxLoRAs(worker string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loraSlots[worker]
}

// EngineAdapters returns the LoRA adapters the worker's engine runs or queues requests
// of, or did within the residency set by [Scraper.RememberAdapters], as its last fresh
// page said (nil: none, unknown, or stale). The router counts them as running there,
// with its own: an engine also runs requests that did not come through this kvroute
// (another replica without peers, direct traffic, requests from before a restart). The
// slice is shared: read it, do not change it.
func (s *Scraper) EngineAdapters(worker string) []string {
	s.mu.Lock()
	r, ok := s.loraAdapters[worker]
	s.mu.Unlock()
	if !ok || s.now().Sub(r.at) > s.stale() {
		return nil
	}
	return r.names
}

// RememberAdapters makes an adapter the engine reported count for residency after the
// last page naming it, as the router counts its own adapters after their last request
// (lora_residency): the engine's page names only adapters with requests now, and a
// session's next turn comes back to its adapter within its pause. Call it before Run.
func (s *Scraper) RememberAdapters(residency time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.adapterResidency = residency
}

// adapterReading is a worker's running, waiting and remembered adapters at a scrape.
type adapterReading struct {
	names  []string
	at     time.Time
	memory AdapterMemory
	// running and waiting are the last page's own lists, for LoRAState.
	running, waiting []string
}

// LoRAState implements router.LoRAStates for the gie-lora picker (GIE's lora-affinity
// score): [LoRAInfo.State] of the worker's last fresh page alone, as GIE reads it.
// Unknown without a fresh page or a max_lora.
func (s *Scraper) LoRAState(worker, adapter string) scoring.LoRAState {
	s.mu.Lock()
	r, ok := s.loraAdapters[worker]
	slots := s.loraSlots[worker]
	s.mu.Unlock()
	if slots == 0 {
		return scoring.LoRAUnknown
	}
	if ok && s.now().Sub(r.at) > s.stale() {
		return scoring.LoRAUnknown
	}
	return LoRAInfo{MaxLoRAs: slots, Running: r.running, Waiting: r.waiting}.State(adapter)
}

// State is the adapter's state on the engine, as GIE's lora-affinity scorer reads it:
// it runs there; or fewer than MaxLoRAs adapters run or wait (a slot is free); or its
// requests wait there; or every slot is taken. Unknown without MaxLoRAs.
func (i LoRAInfo) State(adapter string) scoring.LoRAState {
	switch {
	case i.MaxLoRAs <= 0:
		return scoring.LoRAUnknown
	case slices.Contains(i.Running, adapter):
		return scoring.LoRARunning
	case len(i.Running)+len(i.Waiting) < i.MaxLoRAs:
		return scoring.LoRASlotFree
	case slices.Contains(i.Waiting, adapter):
		return scoring.LoRAQueued
	}
	return scoring.LoRAFull
}

// AdapterMemory remembers the LoRA adapters an engine reported, each until residency
// after the last report naming it. The zero value is ready to use. It holds at most
// MaxScrapedLoRAs adapters (the ones reported last), whatever the engine reports.
type AdapterMemory struct {
	seen map[string]time.Time
}

// Observe records the adapters one report names at now (the first MaxScrapedLoRAs of
// them) and returns those resident: the reported ones, then the remembered ones most
// recently reported first, at most MaxScrapedLoRAs in all; nil when none.
func (m *AdapterMemory) Observe(reported []string, now time.Time, residency time.Duration) []string {
	if m.seen == nil {
		m.seen = map[string]time.Time{}
	}
	reported = reported[:min(len(reported), MaxScrapedLoRAs)]
	current := make(map[string]bool, len(reported))
	for _, name := range reported {
		m.seen[name], current[name] = now, true
	}
	var remembered []string
	for name, at := range m.seen {
		switch {
		case current[name]:
		case residency <= 0 || now.Sub(at) > residency:
			delete(m.seen, name)
		default:
			remembered = append(remembered, name)
		}
	}
	// Most recently reported first (by name among equals), so that a page naming new
	// adapters each scrape cannot grow the memory: the oldest go.
	slices.SortFunc(remembered, func(a, b string) int {
		if c := m.seen[b].Compare(m.seen[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	if keep := MaxScrapedLoRAs - len(reported); len(remembered) > keep {
		for _, name := range remembered[keep:] {
			delete(m.seen, name)
		}
		remembered = remembered[:keep]
	}
	out := append(slices.Clip(reported), remembered...)
	if len(out) == 0 {
		return nil
	}
	return out
}

// readLoRAInfo reads w's max_lora and adapters from its page. An unreadable value is
// logged once per change of error and leaves the worker unknown (0 slots, no
// adapters): the cost then leaves adapter slots out, as without LoRA.
func (s *Scraper) readLoRAInfo(w Worker, page []byte) {
	info, err := ParseLoRAInfo(page)
	names := info.Adapters() // before the lock decisions take: a page may name thousands
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
		s.log.Warn("engine LoRA info unreadable: the worker's adapter slots and running adapters are unknown (set workers[].max_loras)", "worker", w.Name, "error", err)
	}
	if msg == "" {
		delete(s.loraErr, w.Name)
	} else {
		s.loraErr[w.Name] = msg
	}
	if info.MaxLoRAs > 0 {
		s.loraSlots[w.Name] = info.MaxLoRAs
	} else {
		delete(s.loraSlots, w.Name)
	}
	if err != nil {
		delete(s.loraAdapters, w.Name)
		return
	}
	r := s.loraAdapters[w.Name]
	r.at, r.running, r.waiting = s.now(), info.Running, info.Waiting
	r.names = r.memory.Observe(names, r.at, s.adapterResidency)
	s.loraAdapters[w.Name] = r
}
