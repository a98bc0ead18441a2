package enginemetrics

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Capacity units, the values of engine_metrics.capacity_unit.
const (
	UnitBlocks = "blocks"
	UnitTokens = "tokens"
)

// DefaultMaxCapacityBlocks bounds a scraped capacity: 2^20 blocks is 16M tokens at
// vLLM's block size of 16, past any single engine today. The index's memory grows with
// capacity, so an absurd page must not set it.
const DefaultMaxCapacityBlocks = 1 << 20

func (c Config) validateCapacity() error {
	switch {
	case c.CapacityMetric == "":
		return errors.New("engine_metrics.capacity_metric: must not be empty")
	case c.CapacityUnit != UnitBlocks && c.CapacityUnit != UnitTokens:
		return fmt.Errorf("engine_metrics.capacity_unit: must be %s or %s, got %q", UnitBlocks, UnitTokens, c.CapacityUnit)
	case c.MaxCapacityBlocks < 1:
		return fmt.Errorf("engine_metrics.max_capacity_blocks: must be ≥ 1, got %d", c.MaxCapacityBlocks)
	}
	return nil
}

// engineBlockSizeLabel is the label vLLM's cache_config_info gives its block size in:
// capacity in the engine's blocks is converted to kvroute's.
const engineBlockSizeLabel = "block_size"

// ParseCapacity reads an engine's KV cache capacity, in blocks of blockSize tokens,
// from its metrics page (the Prometheus text format). The value is label's on metric
// (vLLM: num_gpu_blocks on vllm:cache_config_info), or with label empty the series'
// value (SGLang: sglang:max_total_num_tokens), in unit: blocks (the engine's: converted
// by the series' block_size label when it has one) or tokens. It is summed over the
// metric's series (each data-parallel rank has its own cache). Only the metric's lines
// are parsed, so the rest of the page costs a scan.
//
// The page is hostile: every value must be a finite whole number, and the result must
// lie in [1, maxBlocks]; anything else (NaN, "None" before vLLM has profiled its
// memory, 1e300) is an error, never a clamped guess.
func ParseCapacity(page []byte, metric, label, unit string, blockSize, maxBlocks int) (int, error) {
	blocks, _, err := parseCapacity(page, metric, label, unit, blockSize, maxBlocks)
	return blocks, err
}

// parseCapacity is ParseCapacity, also returning the engine's own block size when the
// series' block_size label gives it (0 otherwise), so that a mismatch with kvroute's
// can be told.
func parseCapacity(page []byte, metric, label, unit string, blockSize, maxBlocks int) (blocks, engineBlockSize int, err error) {
	if blockSize < 1 {
		return 0, 0, fmt.Errorf("block size %d", blockSize)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(linesOf(page, metric)))
	if err != nil {
		return 0, 0, fmt.Errorf("parse %s: %w", metric, err)
	}
	family := families[metric]
	if family == nil || len(family.GetMetric()) == 0 {
		return 0, 0, fmt.Errorf("no %s in the engine's metrics", metric)
	}
	limit := float64(maxBlocks)
	var tokens float64
	for _, m := range family.GetMetric() {
		value, err := capacityValue(m, label)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", metric, err)
		}
		perBlock := float64(blockSize)
		if unit == UnitTokens {
			perBlock = 1
		} else if bs, ok := labelValue(m, engineBlockSizeLabel); ok {
			if perBlock, err = wholeNumber(bs); err != nil || perBlock < 1 || perBlock > 1<<20 {
				return 0, 0, fmt.Errorf("%s: label %s=%q is not a block size", metric, engineBlockSizeLabel, bs)
			}
			if engineBlockSize == 0 {
				engineBlockSize = int(perBlock)
			}
		}
		if value < 1 || value*perBlock/float64(blockSize) > limit {
			return 0, 0, fmt.Errorf("%s: capacity %g × %g tokens is outside [1, %d] blocks of %d tokens", metric, value, perBlock, maxBlocks, blockSize)
		}
		tokens += value * perBlock
	}
	whole := math.Floor(tokens / float64(blockSize))
	if whole < 1 || whole > limit {
		return 0, 0, fmt.Errorf("%s: capacity %g blocks is outside [1, %d]", metric, whole, maxBlocks)
	}
	return int(whole), engineBlockSize, nil
}

// capacityValue is one series' capacity: its label's value, or its own value.
func capacityValue(m *dto.Metric, label string) (float64, error) {
	if label != "" {
		v, ok := labelValue(m, label)
		if !ok {
			return 0, fmt.Errorf("no label %s", label)
		}
		n, err := wholeNumber(v)
		if err != nil {
			return 0, fmt.Errorf("label %s=%q: %w", label, v, err)
		}
		return n, nil
	}
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, errors.New("not a gauge")
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v != math.Trunc(v) {
		return 0, fmt.Errorf("value %g is not a whole number", v)
	}
	return v, nil
}

func labelValue(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

// wholeNumber parses a label value such as "2048" or "2048.0".
func wholeNumber(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v != math.Trunc(v) {
		return 0, errors.New("not a whole number")
	}
	return v, nil
}

// linesOf returns the lines of page that belong to metric: its samples and its HELP and
// TYPE comments. The text format is line-based, so this is a sound filter.
func linesOf(page []byte, metric string) []byte {
	var out []byte
	for len(page) > 0 {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i+1], page[i+1:]
		} else {
			page = nil
		}
		if belongs(bytes.TrimLeft(line, " \t"), metric) {
			out = append(out, line...)
			if line[len(line)-1] != '\n' {
				out = append(out, '\n')
			}
		}
	}
	return out
}

func belongs(line []byte, metric string) bool {
	if rest, ok := bytes.CutPrefix(line, []byte("# HELP ")); ok {
		line = rest
	} else if rest, ok := bytes.CutPrefix(line, []byte("# TYPE ")); ok {
		line = rest
	}
	rest, ok := bytes.CutPrefix(line, []byte(metric))
	return ok && len(rest) > 0 && (rest[0] == '{' || rest[0] == ' ' || rest[0] == '\t')
}

// capacityReport is a scraper's capacity reporting, off until ReportCapacity.
type capacityReport struct {
	report    func(worker, address string, blocks int)
	blockSize int
	last      map[string]capacityReading // by worker, under the scraper's lock
}

type capacityReading struct {
	address string
	blocks  int    // 0: none valid
	err     string // why not, as last logged
	// engineBlockSize is the engine's block size as its page says (0: not said), so
	// that a mismatch with kvroute's is warned of once per change.
	engineBlockSize int
}

// ReportCapacity makes each scrape read the worker's KV capacity (Config's Capacity*
// keys) in blocks of blockSize tokens, and call report when it changes, outside the
// scraper's lock. blocks is 0 when the page stops giving a valid capacity (the worker
// then falls back to index.capacity_blocks). A failed scrape reports nothing: a
// capacity must not flap with the network, since shrinking it evicts index entries.
// Call it before Run.
func (s *Scraper) ReportCapacity(blockSize int, report func(worker, address string, blocks int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.capacity = capacityReport{report: report, blockSize: blockSize, last: map[string]capacityReading{}}
}

// readCapacity reads w's capacity from its page and reports a change.
func (s *Scraper) readCapacity(w Worker, page []byte) {
	s.mu.Lock()
	c := s.capacity
	s.mu.Unlock()
	if c.report == nil {
		return
	}
	blocks, engineBlockSize, err := parseCapacity(page, s.cfg.CapacityMetric, s.cfg.CapacityLabel, s.cfg.CapacityUnit, c.blockSize, s.cfg.MaxCapacityBlocks)
	now := capacityReading{address: w.Address, blocks: blocks, engineBlockSize: engineBlockSize}
	if err != nil {
		now.err = err.Error()
	}
	s.mu.Lock()
	if !slices.Contains(s.workers, w) { // removed or moved while this scrape ran
		s.mu.Unlock()
		return
	}
	was, known := s.capacity.last[w.Name]
	s.capacity.last[w.Name] = now
	s.mu.Unlock()
	if err != nil && (!known || was.err != now.err) {
		s.log.Warn("engine KV capacity unreadable: the worker uses capacity_blocks or index.capacity_blocks", "worker", w.Name, "error", err)
	}
	if now.engineBlockSize != 0 && now.engineBlockSize != c.blockSize && (!known || was.engineBlockSize != now.engineBlockSize) {
		// The capacity is converted, but kvroute's blocks are not the engine's: its
		// prefix hits are counted in the wrong blocks and KV events are refused.
		s.log.Warn("the engine's block size is not kvroute's (set block_size to the engines')", "worker", w.Name,
			"engine_block_size", now.engineBlockSize, "block_size", c.blockSize)
	}
	if (known && (was.address != now.address || was.blocks != now.blocks)) || (!known && blocks > 0) {
		reported := false
		defer func() {
			if !reported {
				s.forgetCapacity(w, now, was, known)
			}
		}()
		c.report(w.Name, w.Address, blocks)
		reported = true
	}
}

// forgetCapacity takes back now, the reading of w whose report panicked (the scrape's
// guard recovers it, and the scrape failed): was is what was reported before, if
// known. The next scrape then reports the capacity again, even unchanged.
func (s *Scraper) forgetCapacity(w Worker, now, was capacityReading, known bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.capacity.last[w.Name] != now { // a later scrape's since
		return
	}
	if known {
		s.capacity.last[w.Name] = was
	} else {
		delete(s.capacity.last, w.Name)
	}
}
