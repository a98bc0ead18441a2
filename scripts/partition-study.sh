#!/usr/bin/env bash
# What placement can reach on Workload A (docs/BENCHMARKS.md): replays every way of
# splitting its 16 sessions 8/8 over the 2 workers (the first session on w0; 6,435
# partitions), or every STEP-th of them, with the partition:<digits> oracle (sessions
# never move), next to kv and kvroute, and prints per seed: kvroute's excess recompute
# over the 76,288-token floor (as a share of kv's recompute) and resumed p95 × kv, the
# share of partitions within 2 % of the floor, the best excess, and the partitions'
# resumed p95 × kv (median / best) with kvroute's rank among them.
# Usage: scripts/partition-study.sh SEEDS [STEP]   e.g. scripts/partition-study.sh 1-3
# PARALLEL=N runs N replays at once (default 1); KEEP=DIR keeps the raw JSON results there;
# ONES=K puts K of sessions 2–16 on w1 instead of 8 (7 or 9: the 9/7 splits).
set -euo pipefail
seeds=$1 step=${2:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
go build -o "$tmp/replay" ./cmd/replay
# Worker digits of sessions 2–16 in arrival order: 15 bits with ONES ones, in mask order.
awk -v step="$step" -v k="${ONES:-8}" 'BEGIN {
	for (m = 0; m < 32768; m++) {
		s = ""; ones = 0
		for (i = 0; i < 15; i++) { b = int(m / 2^i) % 2; ones += b; s = s b }
		if (ones == k && n++ % step == 0) print "partition:0" s
	}
}' | split -l 400 - "$tmp/chunk."
runs=("kv,kvroute")
for f in "$tmp"/chunk.*; do runs+=("$(paste -sd, "$f")"); done
i=0
for policies in "${runs[@]}"; do
	nice -n 10 "$tmp/replay" -workload sessions -seeds "$seeds" -parallel "${PARALLEL:-1}" -format json \
		-policies "$policies" 2>/dev/null >"$tmp/out.$i.json"
	i=$((i + 1))
done
jq -s -r 'add | group_by(.seed)[] |
	(map(select(.policy == "kv"))[0]) as $kv | (map(select(.policy == "kvroute"))[0]) as $kr |
	map(select(.policy | startswith("partition:"))) as $p |
	def excess: (.recomputed_prefill_tokens - 76288) / $kv.recomputed_prefill_tokens * 100;
	def p95x: .resumed_ttft_p95_ms / $kv.resumed_ttft_p95_ms;
	($p | map(p95x) | sort) as $q |
	"seed \($kv.seed): kvroute excess \($kr | excess | . * 10 | round / 10) %, p95 × kv \($kr | p95x | . * 1000 | round / 1000)" +
	" | \($p | length) partitions: within 2 % \(($p | map(select(excess <= 2)) | length) * 100 / ($p | length) | round) %," +
	" best excess \($p | map(excess) | min | . * 10 | round / 10) %, p95 × kv median \($q[($q | length) / 2 | floor] | . * 1000 | round / 1000)" +
	" best \($q[0] | . * 1000 | round / 1000), kvroute better than \(($q | map(select(. > ($kr | p95x))) | length) * 100 / ($q | length) | round) %"' \
	"$tmp"/out.*.json
if [[ -n ${KEEP:-} ]]; then
	mkdir -p "$KEEP" && cp "$tmp"/out.*.json "$KEEP"/
fi
