package replay

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/kvroute/kvroute/scoring"
)

// NewPicker builds a policy from its replay name: round_robin, random, least_load, gie,
// kvroute (kvroute's built-in default), kv (Dynamo's default cost) or
// kv:<param>=<value>[,…] / kvroute:<param>=<value>[,…] (a cost with overrides).
func NewPicker(spec string, rng *rand.Rand) (scoring.Picker, error) {
	name, args, hasArgs := strings.Cut(spec, ":")
	switch name {
	case "round_robin":
		return &scoring.RoundRobin{}, nil
	case "random":
		return scoring.NewRandom(rng), nil
	case "least_load":
		return scoring.LeastLoad{}, nil
	case "gie":
		return scoring.NewGIE(rng), nil
	case "kv", "kvroute":
		p := scoring.DynamoParams()
		if name == "kvroute" {
			p = scoring.DefaultParams()
		}
		if hasArgs {
			for _, kv := range strings.Split(args, ",") {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, fmt.Errorf("policy %q: %q is not param=value", spec, kv)
				}
				if err := p.Set(strings.TrimSpace(k), strings.TrimSpace(v)); err != nil {
					return nil, fmt.Errorf("policy %q: %w", spec, err)
				}
			}
		}
		return scoring.NewKVCost(p, rng)
	}
	return nil, fmt.Errorf("policy %q: unknown (round_robin, random, least_load, gie, kvroute, kv, kv:<param>=<value>,…)", spec)
}
