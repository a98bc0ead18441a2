// Package replay measures routing quality: it replays a workload in virtual time
// through the same router the ext_proc server runs, against simulated workers (package
// sim), and reports recomputed prompt tokens, moved session turns, TTFT and load
// balance per policy. Runs are deterministic under a seed.
package replay
