package replay

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/kvroute/kvroute/scoring"
)

// NewPicker builds a policy from its replay name: a name of the server's picker table
// ([scoring.Pickers]: kv is Dynamo's default cost there), kvroute (the kv picker with
// kvroute's built-in default parameters), or kv:<param>=<value>[,…] /
// kvroute:<param>=<value>[,…] (a cost with overrides), or partition:<digits> (the
// placement oracle [Partition]). kvroute's parameters are its defaults at the
// reference block size (scoring.DefaultParams); NewPolicyPicker takes the engines'.
func NewPicker(spec string, rng *rand.Rand) (scoring.Picker, error) {
	picker, _, err := NewPolicyPicker(spec, 0, rng)
	return picker, err
}

// NewPolicyPicker is NewPicker that also returns the policy the picker prices with
// (DynamoParams for pickers without a cost), whose disaggregate_tokens splits requests
// in fleets with prefill workers. kvroute's defaults are those for blockSize-token
// blocks (scoring.DefaultParamsFor; ≤ 0: the reference), as the server's for its
// block_size.
func NewPolicyPicker(spec string, blockSize int, rng *rand.Rand) (scoring.Picker, *scoring.Policy, error) {
	dynamo, err := scoring.NewPolicy(scoring.DynamoParams())
	if err != nil {
		return nil, nil, err
	}
	name, args, hasArgs := strings.Cut(spec, ":")
	if name == "partition" {
		p, err := parsePartition(spec, args)
		return p, dynamo, err
	}
	params := scoring.DynamoParams()
	if name == "kvroute" {
		name, params = "kv", scoring.DefaultParamsFor(blockSize)
	}
	entry, ok := scoring.Pickers()[name]
	if !ok {
		return nil, nil, fmt.Errorf("policy %q: unknown (%s, kvroute, kv:<param>=<value>,…, partition:<digits>)", spec, scoring.PickerNames())
	}
	if hasArgs {
		for _, kv := range strings.Split(args, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, nil, fmt.Errorf("policy %q: %q is not param=value", spec, kv)
			}
			// disaggregate_tokens is the router's, whatever the picker (llm-d's
			// prefix-based decider beside GIE's scorers).
			if k = strings.TrimSpace(k); !entry.HasCost && k != "disaggregate_tokens" {
				return nil, nil, fmt.Errorf("policy %q: %s has no cost parameters", spec, name)
			}
			if err := params.Set(k, strings.TrimSpace(v)); err != nil {
				return nil, nil, fmt.Errorf("policy %q: %w", spec, err)
			}
		}
	}
	policy, err := scoring.NewPolicy(params)
	if err != nil {
		return nil, nil, fmt.Errorf("policy %q: %w", spec, err)
	}
	return entry.New(policy, rng), policy, nil
}
