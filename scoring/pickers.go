package scoring

import (
	"math/rand/v2"
	"slices"
	"strings"
)

// PickerSpec describes one policy of the picker table.
type PickerSpec struct {
	// New builds the picker. policy holds the cost parameters in force (only pickers
	// with HasCost read it); rng drives tie-breaking and sampling.
	New func(policy *Policy, rng *rand.Rand) Picker
	// HasCost says the picker prices candidates with the policy's cost parameters, so
	// runtime policy updates and per-route overrides apply to it.
	HasCost bool
	// EngineSignals says the picker reads what engines report of themselves (queue,
	// KV usage), so they must be scraped.
	EngineSignals bool
	// EngineLoRA says the picker reads each engine's state for the request's LoRA
	// adapter (Candidate.EngineLoRA).
	EngineLoRA bool
}

// Pickers returns the policies by the name `policy.picker` gives them: the one table of
// policies, read by the server's config and by replays.
func Pickers() map[string]PickerSpec {
	return map[string]PickerSpec{
		"kv":          {New: func(p *Policy, rng *rand.Rand) Picker { return NewKVCostWithPolicy(p, rng) }, HasCost: true},
		"round_robin": {New: func(*Policy, *rand.Rand) Picker { return &RoundRobin{} }},
		"random":      {New: func(_ *Policy, rng *rand.Rand) Picker { return NewRandom(rng) }},
		"least_load":  {New: func(*Policy, *rand.Rand) Picker { return LeastLoad{} }},
		"gie":         {New: func(_ *Policy, rng *rand.Rand) Picker { return NewGIE(rng) }, EngineSignals: true},
		// GIE's default profile with its lora-affinity scorer at weight 1, as deployments
		// serving LoRA adapters configure the endpoint picker.
		"gie-lora": {New: func(_ *Policy, rng *rand.Rand) Picker { return NewGIEWithLoRA(rng, 1) }, EngineSignals: true, EngineLoRA: true},
	}
}

// PickerNames lists the table's names, sorted, for error messages.
func PickerNames() string {
	var names []string
	for name := range Pickers() {
		names = append(names, name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
