# kvroute: `make demo` runs the main job, `make test` runs every check CI runs.
# go.mod needs Go 1.27 (github.com/ardanlabs/jinja); machines preset GOTOOLCHAIN=local, so
# name the toolchain the go command fetches from the module proxy.
export GOTOOLCHAIN := go1.27.3
GO ?= go
PKGS := ./...

.PHONY: test vet fmt-check fuzz-targets-check race bench demo build fuzz replay replay-shared-prefix replay-lora replay-pd replay-host loadtest

## TRACES: the directory of the Mooncake traces, which are not in this repository (they
## are in ../shared/data/, beside it); from a clone elsewhere: make replay-pd TRACES=DIR
TRACES ?= ../shared/data

## replay: the Workload A table of docs/BENCHMARKS.md
replay:
	$(GO) run ./cmd/replay -workload sessions -seeds 1-20 -policies round_robin,kv,kv:prefix_affinity_weight=1,kv:prefix_affinity_weight=2,kv:prefix_affinity_weight=4,kv:prefill_load_scale=4,kv:prefix_affinity_weight=1000,gie,kvroute

## replay-shared-prefix: the shared-prefix tables of docs/BENCHMARKS.md (issue 11), 4 and 16 batch slots
SHARED_PREFIX_POLICIES := round_robin,gie,kv,kvroute,kvroute:queue_weight=0,kvroute:shared_prefix_affinity=1,kvroute:queue_weight=0,shared_prefix_affinity=1,kvroute:queue_weight=0,shared_prefix_affinity=1,active_request_weight=64
replay-shared-prefix:
	$(GO) run ./cmd/replay -workload shared-prefix -max-num-seqs 4 -seeds 1-10 -policies $(SHARED_PREFIX_POLICIES)
	$(GO) run ./cmd/replay -workload shared-prefix -max-num-seqs 16 -seeds 1-10 -policies $(SHARED_PREFIX_POLICIES)

## replay-lora: the LoRA tables of docs/BENCHMARKS.md: Workload A's sessions on LoRA
## adapters, workers running 2 adapters (and 1) at once
LORA_POLICIES := gie,gie-lora,kv,kvroute:lora_weight=0,kvroute:lora_weight=256,kvroute
replay-lora:
	$(GO) run ./cmd/replay -workload sessions -lora-adapters 4 -max-loras 2 -seeds 1-10 -policies $(LORA_POLICIES)
	$(GO) run ./cmd/replay -workload sessions -lora-adapters 8 -max-loras 2 -workers 4 -sessions 32 -seeds 1-10 -policies $(LORA_POLICIES)
	$(GO) run ./cmd/replay -workload sessions -lora-adapters 4 -max-loras 1 -seeds 1-10 -policies $(LORA_POLICIES)

## replay-host: the host-tier (CPU offload) tables of docs/BENCHMARKS.md: the Mooncake
## conversation trace on engines with a device cache of 8,192 blocks and a host tier of
## 32,768 (in blocks, in LMCache's 256-token chunks, without KV events), then Workload A behind a host tier (512 and 384 device blocks, memory_weight), KV events
HOST_TRACE := -workload mooncake -trace $(TRACES)/mooncake_conversation_trace.jsonl -max-requests 3000 -speedup 1 -jitter-ms 3000 -workers 8 -index events -num-gpu-blocks 8192
replay-host:
	$(GO) run ./cmd/replay $(HOST_TRACE) -host-blocks 32768 -seeds 1-5 -policies gie,kv,kvroute,kvroute:offload_credit=0,kvroute:offload_credit=0.25,kvroute:offload_credit=0.5,kvroute:offload_credit=1
	$(GO) run ./cmd/replay $(HOST_TRACE) -host-blocks 32768 -seeds 1-5 -tiers device,host -offload-tiers "" -policies kvroute
	$(GO) run ./cmd/replay $(HOST_TRACE) -host-blocks 32768 -host-chunk-blocks 4 -seeds 1-5 -policies gie,kv,kvroute,kvroute:offload_credit=0
	$(GO) run ./cmd/replay $(subst -index events ,,$(HOST_TRACE)) -host-blocks 32768 -seeds 1-5 -policies gie,kv,kvroute
	$(GO) run ./cmd/replay $(subst -index events ,,$(HOST_TRACE)) -host-blocks 32768 -seeds 1-5 -approximate-offload -policies kvroute,kvroute:offload_credit=0
	$(GO) run ./cmd/replay -workload sessions -num-gpu-blocks 384 -host-blocks 2048 -seeds 1-20 -approximate-offload -policies kvroute,kvroute:offload_credit=0,kvroute:memory_weight=256
	$(GO) run ./cmd/replay $(HOST_TRACE) -host-blocks 8192 -seeds 1-5 -policies kv,kvroute,kvroute:offload_credit=0
	$(GO) run ./cmd/replay $(HOST_TRACE) -seeds 1-5 -policies kv,kvroute
	$(GO) run ./cmd/replay -workload sessions -index events -host-blocks 2048 -seeds 1-20 -policies kv,kvroute,kvroute:offload_credit=0
	$(GO) run ./cmd/replay -workload sessions -index events -num-gpu-blocks 384 -host-blocks 2048 -seeds 1-20 -policies kv,kvroute,kvroute:offload_credit=0
	$(GO) run ./cmd/replay -workload sessions -index events -num-gpu-blocks 384 -host-blocks 2048 -seeds 1-20 -policies kvroute:memory_weight=16,kvroute:memory_weight=64,kvroute:memory_weight=128,kvroute:memory_weight=256
	$(GO) run ./cmd/replay -workload sessions -num-gpu-blocks 384 -seeds 1-20 -policies kv,kvroute,kvroute:memory_weight=64,kvroute:memory_weight=256

## replay-pd: the disaggregated prefill/decode tables of docs/BENCHMARKS.md: Workload A
## and the shared-prefix workload on 2 decode + 2 prefill workers, the Mooncake
## conversation trace on 4 + 4
PD_POLICIES := kv,gie,gie:disaggregate_tokens=512,kvroute,kvroute:disaggregate_tokens=512,kvroute:disaggregate_tokens=100000
replay-pd:
	$(GO) run ./cmd/replay -workload sessions -workers 2 -prefill-workers 2 -seeds 1-10 -policies $(PD_POLICIES)
	$(GO) run ./cmd/replay -workload shared-prefix -workers 2 -prefill-workers 2 -seeds 1-5 -policies $(PD_POLICIES)
	$(GO) run ./cmd/replay -workload mooncake -trace $(TRACES)/mooncake_conversation_trace.jsonl -max-requests 3000 -speedup 4 -jitter-ms 3000 -workers 4 -prefill-workers 4 -seeds 1-3 -policies gie,kv,kvroute,kvroute:disaggregate_tokens=512

## test: formatting, vet, and every test under the race detector (what CI runs)
test: fmt-check fuzz-targets-check vet race

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## vet with cgo off: the static binaries (`make build`, the Dockerfile, the tests that
## build extproc) are cgo-off too, so one compile of the dependencies serves them all; a
## cgo-on compile would be a third full one next to the race tests' (client-go is large).
vet:
	CGO_ENABLED=0 $(GO) vet $(PKGS)

race:
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

## bench: the routing-core and server-path benchmarks recorded in docs/BENCHMARKS.md
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./index ./router ./filter ./jsonv | tee bench.txt

## fuzz: a bounded run of each fuzz target (longer: FUZZTIME=5m make fuzz). `make test`
## replays every committed corpus (testdata/fuzz/<FuzzName>/) as ordinary tests.
## -fuzz takes a regexp: anchor it, or FuzzParse also matches FuzzParseUsage and go refuses.
## FUZZ_TARGETS: every fuzz target, as package:FuzzName.
FUZZ_TARGETS := \
	./tokenize:FuzzApprox \
	./tokenize/hf:FuzzParse \
	./tokenize/hf:FuzzEncode \
	./tokenize/hf:FuzzUnicodeForms \
	./tokenize/template:FuzzRender \
	./tokenize/template:FuzzNew \
	./tokenize/template:FuzzQwen3Direct \
	./tokenize/template:FuzzLlama3Direct \
	./tokenize/template:FuzzTojson \
	./tokenize/template:FuzzBindTojson \
	./tokenize/engine:FuzzParseRender \
	./jsonv:FuzzParse \
	./jsonv:FuzzValueMatchesTheOnePassReader \
	./jsonv:FuzzAppendUint32sMatchesEncodingJSON \
	./openai:FuzzParse \
	./openai:FuzzParseUsage \
	./openai:FuzzMessagesChat \
	./openai:FuzzSetModel \
	./openai:FuzzModelRenamer \
	./openai:FuzzParseResponses \
	./openai:FuzzResponsesChat \
	./openai:FuzzResponseIDReader \
	./openai:FuzzParseGenerate \
	./openai:FuzzParseSGLangGenerate \
	./openai:FuzzParseSGLangSessionControl \
	./openai:FuzzSGLangSessionIDReader \
	./cmd/extproc:FuzzParseConfig \
	./scoring:FuzzApplyJSON \
	./enginemetrics:FuzzParse \
	./enginemetrics:FuzzParseCapacity \
	./enginemetrics:FuzzParseMaxLoRAs \
	./enginemetrics:FuzzParseRequests \
	./enginemodels:FuzzParse \
	./discovery:FuzzParseWorkers \
	./filter:FuzzStream \
	./kvevents:FuzzDecode \
	./kvevents:FuzzApply \
	./kvevents:FuzzFrames \
	./kvevents:FuzzCheckReady \
	./peers:FuzzParseReport

## fuzz-targets-check: every Fuzz function in the tree is in FUZZ_TARGETS (so make fuzz runs it).
fuzz-targets-check:
	@missing=0; for f in $$(git grep -l '^func Fuzz' -- '*_test.go' 2>/dev/null || grep -rl '^func Fuzz' --include='*_test.go' .); do \
		for name in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			case " $(FUZZ_TARGETS) " in *" ./$$(dirname $$f):$$name "*) ;; *) echo "$$f: $$name is not in FUZZ_TARGETS"; missing=1;; esac; \
		done; \
	done; exit $$missing

## FUZZMINIMIZETIME bounds the engine's minimizing of each new interesting input (go's
## default, 60 s, is longer than a whole run: minimizing a large input stalled
## FuzzParseConfig and FuzzParseReport for the rest of theirs).
FUZZTIME ?= 20s
FUZZMINIMIZETIME ?= 5s
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} in $${t%%:*}"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) "$${t%%:*}"; \
	done

build:
	CGO_ENABLED=0 $(GO) build -o bin/ ./cmd/extproc ./cmd/mockworker ./cmd/replay ./cmd/demo ./cmd/loadtest ./cmd/dataplane

## loadtest: kvroute under sustained load on loopback (docs/BENCHMARKS.md); e.g.
## make loadtest LOADTEST_FLAGS="-streams 1000 -duration 10m"
LOADTEST_FLAGS ?= -streams 200 -duration 2m
loadtest: build
	bin/loadtest $(LOADTEST_FLAGS)

## demo: the main job: simulated workers + kvroute + the test data plane on loopback,
## resumed sessions through the OpenAI client, kvroute's policy against Dynamo's default
demo: build
	bin/demo -bin bin
