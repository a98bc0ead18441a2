# kvroute: `make demo` runs the main job, `make test` runs every check CI runs.
# go.mod needs Go 1.27 (github.com/ardanlabs/jinja); machines preset GOTOOLCHAIN=local, so
# name the toolchain the go command fetches from the module proxy.
export GOTOOLCHAIN := go1.27.3
GO ?= go
PKGS := ./...

.PHONY: test vet fmt-check race bench demo build fuzz replay

## replay: the Workload A table of docs/BENCHMARKS.md
replay:
	$(GO) run ./cmd/replay -workload sessions -seeds 1-20 -policies round_robin,kv,kv:prefix_affinity_weight=1,kv:prefix_affinity_weight=2,kv:prefix_affinity_weight=4,kv:prefill_load_scale=4,kv:prefix_affinity_weight=1000,gie,kvroute

## test: formatting, vet, and every test under the race detector (what CI runs)
test: fmt-check vet race

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

race:
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

## bench: the routing-core benchmarks recorded in docs/BENCHMARKS.md
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./index ./router ./filter | tee bench.txt

## fuzz: a short run of each fuzz target (longer: FUZZTIME=5m make fuzz)
FUZZTIME ?= 20s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzApprox -fuzztime $(FUZZTIME) ./tokenize
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME) ./jsonv
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./openai
	$(GO) test -run '^$$' -fuzz FuzzParseUsage -fuzztime $(FUZZTIME) ./openai
	$(GO) test -run '^$$' -fuzz FuzzParseConfig -fuzztime $(FUZZTIME) ./cmd/extproc
	$(GO) test -run '^$$' -fuzz FuzzApplyJSON -fuzztime $(FUZZTIME) ./scoring
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./enginemetrics
	$(GO) test -run '^$$' -fuzz FuzzParseCapacity -fuzztime $(FUZZTIME) ./enginemetrics
	$(GO) test -run '^$$' -fuzz FuzzParseWorkers -fuzztime $(FUZZTIME) ./discovery

build:
	CGO_ENABLED=0 $(GO) build -o bin/ ./cmd/extproc ./cmd/mockworker ./cmd/replay ./cmd/demo

## demo: the main job: simulated workers + kvroute + the test data plane on loopback,
## resumed sessions through the OpenAI client, kvroute's policy against Dynamo's default
demo: build
	bin/demo -bin bin
