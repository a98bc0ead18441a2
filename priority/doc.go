// Package priority is the admission step before a routing decision (DESIGN §6's 429
// when shedding): it gives each request the priority of the Gateway API Inference
// Extension objective it names, and says when a candidate worker has the capacity a
// sheddable request needs.
//
// A request names its objective in a header (llm-d-router's x-llm-d-inference-objective,
// then GIE's x-gateway-inference-objective: [Config.Headers]); the objective's priority
// comes from an InferenceObjective of the pool (llm-d.ai/v1alpha2, or GIE's
// inference.networking.x-k8s.io/v1alpha2; spec.priority, read by discovery/kube) or
// from the config's objectives. A name neither defines has priority 0, as GIE's
// endpoint picker gives it. A priority below 0 makes the request sheddable: the router
// sends it only to a candidate with capacity ([Saturation.HasCapacity], GIE's
// saturation detector), refuses it with a 429 when none has, and never refuses a
// priority of 0 or more for saturation.
//
// [Objectives] is safe for concurrent use; [Config] and [Saturation] are values.
package priority
