package rewrite

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Bounds of what one source (the config, or the cluster) may define. A lookup costs one
// map read whatever the count; the bounds keep the table, and the metric's series (one
// per rewrite and target), to what an operator writes by hand.
const (
	MaxRewrites = 1_000
	// MaxRules, MaxMatches and MaxTargets bound one rewrite's rules, and one rule's
	// matched models and targets.
	MaxRules   = 100
	MaxMatches = 100
	MaxTargets = 100
	// MaxWeight is the largest weight of a target (the CRD's maximum).
	MaxWeight = 1_000_000
	// MaxNameBytes bounds a rewrite's name (a Kubernetes object's name is at most 253
	// bytes); MaxModelBytes a model's, as workers' model names are bounded.
	MaxNameBytes  = 253
	MaxModelBytes = 512
)

// The request headers naming a request's target model, as llm-d-router's picker reads
// them (metadata.ModelNameRewriteKey, then its deprecated alias OldModelNameRewriteKey,
// GIE's name): the first one a request carries sets the target, which a rule matching
// the body's model overrides.
const (
	Header       = "x-llm-d-model-name-rewrite"
	LegacyHeader = "x-gateway-model-name-rewrite"
)

// HeaderNames are Header and LegacyHeader, in the order they are read.
func HeaderNames() []string { return []string{Header, LegacyHeader} }

// Errors of a rewrite that cannot be used, wrapped with its YAML path (config) or its
// object's name (cluster).
var (
	ErrName         = errors.New("a rewrite's name has 1 to 253 visible ASCII bytes")
	ErrDuplicate    = errors.New("another rewrite has this name")
	ErrNoRules      = errors.New("a rewrite needs at least one rule")
	ErrNoTargets    = errors.New("a rule needs at least one target")
	ErrModel        = errors.New("a model name has 1 to 512 bytes of UTF-8 without control characters")
	ErrWeight       = errors.New("a weight is in [0, 1000000]")
	ErrMixedWeights = errors.New("weights are set on every target of a rule or on none")
	ErrTooMany      = errors.New("over the bound")
)

// Config is the `model_rewrites` section: the rewrites, in precedence order (an earlier
// one wins a tie, as an older InferenceModelRewrite does).
type Config []Rewrite

// Rewrite is one named set of rules, as one InferenceModelRewrite's spec.rules.
type Rewrite struct {
	// Name names the rewrite in the metric and the decision trace.
	Name  string `yaml:"name" json:"name"`
	Rules []Rule `yaml:"rules" json:"rules"`
}

// Rule maps requests for its models to its targets.
type Rule struct {
	// Models are the request models the rule matches exactly (the request body's
	// "model"); none: every model, a generic rule, which an exact match anywhere beats.
	Models []string `yaml:"models" json:"models"`
	// Targets are the models a matching request is sent to, one drawn per request by
	// weight.
	Targets []Target `yaml:"targets" json:"targets"`
}

// Target is a model a rule sends requests to, and its weight: its share of the rule's
// requests is weight / (sum of the rule's weights). With every weight 0 (unset), each
// target has an equal share; a target without a weight beside weighted ones has none
// (never drawn: a rule the config refuses, Rewrite.Check accepts).
type Target struct {
	Model  string `yaml:"model" json:"model"`
	Weight int32  `yaml:"weight" json:"weight"`
}

// Validate reports the first invalid rewrite, naming its YAML path under
// model_rewrites. Errors wrap the package's Err* values.
func (c Config) Validate() error {
	if len(c) > MaxRewrites {
		return fmt.Errorf("model_rewrites: %w: at most %d rewrites, got %d", ErrTooMany, MaxRewrites, len(c))
	}
	seen := make(map[string]int, len(c))
	for i, rw := range c {
		path := fmt.Sprintf("model_rewrites[%d]", i)
		if err := rw.Validate(); err != nil {
			return fmt.Errorf("%s%w", path, err)
		}
		if j, ok := seen[rw.Name]; ok {
			return fmt.Errorf("%s.name: %w: %q is model_rewrites[%d]'s", path, ErrDuplicate, rw.Name, j)
		}
		seen[rw.Name] = i
	}
	return nil
}

// pathError is an error whose message starts with a YAML path relative to a rewrite
// (".rules[0].targets"), so that callers prefix the rewrite's own path or name.
type pathError struct {
	path string
	err  error
}

func (e *pathError) Error() string { return e.path + ": " + e.err.Error() }
func (e *pathError) Unwrap() error { return e.err }

func at(path string, err error) error { return &pathError{path: path, err: err} }

// Validate reports the first invalid field of the rewrite; the message starts with the
// field's path relative to the rewrite (".rules[1].targets[0].weight: …"). A rule whose
// weights are set on some targets only is invalid here (ErrMixedWeights): the config's
// rewrites are refused for it; Check accepts it.
func (rw Rewrite) Validate() error {
	mixed, err := rw.Check()
	if err != nil {
		return err
	}
	if len(mixed) > 0 {
		return mixed[0]
	}
	return nil
}

// Check is Validate that accepts a rule whose weights are set on some targets only, as
// llm-d-router's endpoint picker does with an InferenceModelRewrite (requestcontrol/
// director.go, selectWeightedModel): such a rule's targets without a weight are never
// drawn. mixed holds one error per such rule (wrapping ErrMixedWeights, with the
// rule's path), to be logged; err is the first invalid field, as Validate's.
func (rw Rewrite) Check() (mixed []error, err error) {
	if err := ValidName(rw.Name); err != nil {
		return nil, at(".name", err)
	}
	switch {
	case len(rw.Rules) == 0:
		return nil, at(".rules", ErrNoRules)
	case len(rw.Rules) > MaxRules:
		return nil, at(".rules", fmt.Errorf("%w: at most %d rules, got %d", ErrTooMany, MaxRules, len(rw.Rules)))
	}
	for i, r := range rw.Rules {
		path := fmt.Sprintf(".rules[%d]", i)
		weighted, err := r.validate(path)
		if err != nil {
			return nil, err
		}
		if weighted != 0 && weighted != len(r.Targets) {
			mixed = append(mixed, at(path+".targets",
				fmt.Errorf("%w: %d of %d have one", ErrMixedWeights, weighted, len(r.Targets))))
		}
	}
	return mixed, nil
}

// validate checks the rule, whose path in its rewrite is path, and returns how many of
// its targets have a weight.
func (r Rule) validate(path string) (weighted int, err error) {
	if len(r.Models) > MaxMatches {
		return 0, at(path+".models", fmt.Errorf("%w: at most %d models, got %d", ErrTooMany, MaxMatches, len(r.Models)))
	}
	for i, m := range r.Models {
		if err := ValidModel(m); err != nil {
			return 0, at(fmt.Sprintf("%s.models[%d]", path, i), err)
		}
	}
	switch {
	case len(r.Targets) == 0:
		return 0, at(path+".targets", ErrNoTargets)
	case len(r.Targets) > MaxTargets:
		return 0, at(path+".targets", fmt.Errorf("%w: at most %d targets, got %d", ErrTooMany, MaxTargets, len(r.Targets)))
	}
	for i, t := range r.Targets {
		if err := ValidModel(t.Model); err != nil {
			return 0, at(fmt.Sprintf("%s.targets[%d].model", path, i), err)
		}
		if t.Weight < 0 || t.Weight > MaxWeight {
			return 0, at(fmt.Sprintf("%s.targets[%d].weight", path, i), fmt.Errorf("%w, got %d", ErrWeight, t.Weight))
		}
		if t.Weight > 0 {
			weighted++
		}
	}
	return weighted, nil
}

// ValidName reports whether name can name a rewrite: 1 to MaxNameBytes visible ASCII
// bytes (a Kubernetes object's name is one). Names are metric label values.
func ValidName(name string) error {
	if name == "" || len(name) > MaxNameBytes {
		return fmt.Errorf("%w, got %d bytes", ErrName, len(name))
	}
	for i := range len(name) {
		if name[i] <= ' ' || name[i] > '~' {
			return fmt.Errorf("%w, got byte %#x in %q", ErrName, name[i], name)
		}
	}
	return nil
}

// ValidModel reports whether m can be a rule's model: 1 to MaxModelBytes bytes of
// UTF-8 without control characters.
func ValidModel(m string) error {
	if m == "" || len(m) > MaxModelBytes || !utf8.ValidString(m) {
		return fmt.Errorf("%w, got %q", ErrModel, truncate(m))
	}
	for _, r := range m {
		if r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Errorf("%w, got %q", ErrModel, truncate(m))
		}
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
