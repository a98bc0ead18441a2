// Package discovery finds the workers kvroute routes among and feeds every change to the
// fleet (package fleet), the same add/remove/change path a config reload takes. It is
// the step before DESIGN §2's request path: it decides who the candidates are.
//
// Three sources, chosen by `discovery.source`:
//   - static: the config file's `workers` list ([Static]);
//   - file: a workers file, watched for changes ([File]); a file that does not parse or
//     validate keeps the workers in force and says why, in the log and in
//     kvroute_discovery_stale;
//   - kubernetes: a Gateway API Inference Extension InferencePool and the pods it
//     selects (package discovery/kube, the only package that imports client-go).
//
// A [Runner] drives one source: it applies each complete worker set the source reports
// to the fleet, skips sets equal to the one in force (informer resyncs, editors that
// save an unchanged file), and reports readiness: the first complete set has arrived
// and the source's input exists (a set of no workers is ready; an InferencePool that
// does not exist is not). The Runner is safe for concurrent use.
package discovery
