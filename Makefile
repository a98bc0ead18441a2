# kvroute: `make demo` runs the main job, `make test` runs every check CI runs.
GO ?= go
PKGS := ./...

.PHONY: test vet fmt-check race bench demo build fuzz

## test: formatting, vet, and every test under the race detector (what CI runs)
test: fmt-check vet race

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

race:
	$(GO) test -race -count=1 $(PKGS)

## bench: the routing-core benchmarks recorded in docs/BENCHMARKS.md
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./index ./router | tee bench.txt

## fuzz: a short run of each fuzz target (longer: FUZZTIME=5m make fuzz)
FUZZTIME ?= 20s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzApprox -fuzztime $(FUZZTIME) ./tokenize

build:
	CGO_ENABLED=0 $(GO) build -o bin/ ./cmd/...

## demo: the main job
demo:
	$(GO) test -run '^$$' -bench . -benchmem ./index ./router
