package filter

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/scoring"
)

// PolicyMetadataKey is the gRPC initial-metadata key that carries a per-route policy
// override, set in the route's ExtProcPerRoute overrides.grpc_initial_metadata. Its
// value is a JSON object of policy keys, e.g. {"prefix_affinity_weight": 2}.
const PolicyMetadataKey = "x-kvroute-policy"

// ExplainMetadataKey is the gRPC initial-metadata key with which a route turns explain
// answers off ("false"), where its clients must not see worker names and addresses.
// "true" leaves them as the config says; other values are an invalid route policy.
const ExplainMetadataKey = "x-kvroute-explain"

// MetadataNamespace is the dynamic-metadata namespace kvroute reads a policy override
// from ("policy" key, a struct of policy keys) when Envoy forwards it
// (metadata_options.forwarding_namespaces.untyped).
const MetadataNamespace = "kvroute"

// ParseOverride decodes a per-route policy override (a JSON object of policy keys) onto
// base, strictly (unknown keys are errors), and validates the result like the config's
// policy section. Errors wrap [ErrBadOverride] and name the key.
func ParseOverride(base scoring.Params, raw []byte) (scoring.Params, error) {
	p, err := base.ApplyJSON(raw)
	if err != nil {
		var fe *scoring.FieldError
		if errors.As(err, &fe) {
			return base, fmt.Errorf("%w: policy.%v", ErrBadOverride, err)
		}
		return base, fmt.Errorf("%w: %v", ErrBadOverride, err)
	}
	return p, nil
}

// routeOverride is a route's policy override: the keys it names, applied on top of the
// policy in force each time its request is decided (router.Request.Override), so a
// runtime update or a reload reaches a request that was already under way (held by
// flow control, say) as it reaches one without an override.
type routeOverride struct {
	raw    []byte         // the JSON object of policy keys
	base   scoring.Params // the policy it was checked on, at the stream's start
	params scoring.Params // raw applied on base
}

// newRouteOverride checks a route's override on the policy in force (errors as
// ParseOverride's).
func newRouteOverride(base scoring.Params, raw []byte) (*routeOverride, error) {
	p, err := ParseOverride(base, raw)
	if err != nil {
		return nil, err
	}
	return &routeOverride{raw: raw, base: base, params: p}, nil
}

// apply returns the override's keys on top of base. It only reads o, set once at the
// stream's start.
func (o *routeOverride) apply(base scoring.Params) scoring.Params {
	if base == o.base {
		return o.params
	}
	p, err := base.ApplyJSON(o.raw)
	if err != nil {
		// Not reached: each key was valid on a valid policy, and each is checked on
		// its own, so it is on any other valid one.
		return o.params
	}
	return p
}

// overrideFromStruct reads the "policy" struct of kvroute's metadata namespace.
func overrideFromStruct(base scoring.Params, s *structpb.Struct) (*routeOverride, error) {
	policy, ok := s.GetFields()["policy"]
	if !ok {
		return nil, nil
	}
	raw, err := policy.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadOverride, err)
	}
	return newRouteOverride(base, raw)
}
