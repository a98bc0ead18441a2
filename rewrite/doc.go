// Package rewrite holds the model rewrites (GIE's InferenceModelRewrite: model aliasing
// and weighted traffic splitting) and chooses a request's target model, the step
// between parsing the body (DESIGN §2, step 3) and routing it: the router then picks
// workers, the tokenizer and the block hashes for the target, and the filter forwards
// the body with the target in its "model" field.
//
// A [Table] merges the config's rewrites (model_rewrites) with the cluster's
// InferenceModelRewrites of the pool; it is safe for concurrent use.
package rewrite
