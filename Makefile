# forwarder: a Benthos distribution that moves parking camera events from
# Kafka to the parking platform through a PostgreSQL outbox.

SHELL        := /bin/bash
GO           ?= go
BIN          := bin/forwarder
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
DATE         := $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS      := -s -w -X main.version=$(VERSION) -X main.dateBuilt=$(DATE)
GOTEST_FLAGS ?= -timeout 15m
E2E_TEST_FLAGS ?= -timeout 25m
E2E_REPORT := bin/e2e-schedule.txt
# Every Go command builds as the Dockerfile does, without cgo and with
# trimmed paths: bin/forwarder is then the binary the image ships, and
# bin/forwarder, the test binaries and the tests that build a forwarder of
# their own (cmd/forwarder, pipelines, docs, the console's browser test, the
# dev stack) share their compiled packages instead of compiling them again
# with other settings (the race detector, which needs cgo, compiles its own).
# Binaries are linked without DWARF (-w, as the image's is): go test links a
# binary per package, and the debug information was a quarter of the link's
# CPU; stack traces and the race detector's reports do not need it.
export CGO_ENABLED := 0
export GOFLAGS ?= -trimpath -ldflags=-w
# The packages whose goroutines share the most state (the dispatcher, its
# plugins, the Kafka input, the outbox processor): make test runs them under
# the race detector, and only so.
RACE_PKGS    := ./plugins/httpforwarder ./plugins/kafka ./plugins/outboxretry ./plugins/outbox ./internal/dispatch ./internal/protection
# go test starts the packages' test binaries in the order it is given them,
# so the longest go first (RACE_PKGS too is longest first): listed in
# alphabetical order they started last and ended last.
SLOW_PKGS    := ./internal/outboxdb ./internal/outboxcli ./internal/dev/devstack ./internal/console
APT_PACKAGES := postgresql pgbouncer openssl prometheus kcat chromium fonts-wqy-microhei gcc libc6-dev
IMAGE        ?= forwarder:$(VERSION)
MODULE        = $(shell $(GO) list -m)

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## Check Go against go.mod; install what the tests and the dev stack need (Debian packages postgresql >= 14, pgbouncer, openssl, prometheus for promtool, kcat, chromium, fonts-wqy-microhei for the plates in the console's screenshots, gcc and libc6-dev for the race detector; Go modules)
	@GO=$(GO) .ci/check-go
	@missing=(); \
	if [ -n "$${PG_BIN_DIR:-}" ]; then .ci/pg-bin-dir >/dev/null || exit 1; \
	else .ci/pg-bin-dir >/dev/null 2>&1 || missing+=(postgresql); fi; \
	[ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer); \
	command -v openssl >/dev/null || missing+=(openssl); \
	command -v promtool >/dev/null || missing+=(prometheus); \
	command -v kcat >/dev/null || missing+=(kcat); \
	command -v chromium >/dev/null || missing+=(chromium); \
	[ -e /usr/share/fonts/truetype/wqy/wqy-microhei.ttc ] || missing+=(fonts-wqy-microhei); \
	command -v gcc >/dev/null || missing+=(gcc libc6-dev); \
	if [ $${#missing[@]} -gt 0 ]; then \
		echo "installing $${missing[*]}"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $${missing[@]} >/dev/null; \
	fi; \
	.ci/pg-bin-dir >/dev/null
	@$(GO) mod download

.PHONY: build
build: ## Build bin/forwarder
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/forwarder

.PHONY: run
run: deps build ## Run the real pipeline on an embedded dev stack (PostgreSQL, Kafka, mock platform, event generator); Ctrl-C stops. Flags: make run ARGS="-rate 500"
	$(GO) build -o bin/devstack ./cmd/devstack
	bin/devstack $(ARGS)

.PHONY: test
test: deps build ## Every test: unit, integration on real PostgreSQL and Kafka (kfake), end to end, the race detector, the deployment files (deploy/validate), the River baseline, go vet and gofmt, forwarder lint and test
	@$(MAKE) --no-print-directory test-e2e
	@$(MAKE) --no-print-directory -j3 --output-sync=line test-go test-race test-modules
	@$(MAKE) --no-print-directory lint-product
	env -u PLATFORM_TZ $(BIN) test ./pipelines/... ./mappings/...

# The end-to-end suite runs first and alone: its scenarios run side by side
# in lanes that leave the CPU room (test/e2e/schedule_test.go), and promises
# about time (a Retry-After pause every instance follows within a second, a
# restart consuming within 15 s, leases renewed before they run out) were
# seen to fail on two cores when the race detector's and the other
# packages' runs shared them. The other go test runs then run together; the
# race detector's and the separate modules' (deploy/validate, the River
# baseline), mostly compiling, yield the CPU (nice).
.PHONY: test-e2e test-go test-race test-modules
test-e2e:
	@rm -f $(E2E_REPORT)
	FORWARDER_BIN=$(CURDIR)/$(BIN) E2E_SCHEDULE_REPORT=$(CURDIR)/$(E2E_REPORT) $(GO) test $(E2E_TEST_FLAGS) ./test/e2e; \
	status=$$?; \
	if [ -s $(E2E_REPORT) ]; then echo "The longest end-to-end scenarios (seconds run, against the schedule's expect):"; sort -rn $(E2E_REPORT) | head -15; fi; \
	exit $$status
test-go:
	FORWARDER_BIN=$(CURDIR)/$(BIN) $(GO) test $(GOTEST_FLAGS) $(SLOW_PKGS) $(filter-out $(MODULE)/test/e2e $(RACE_PKGS:./%=$(MODULE)/%) $(SLOW_PKGS:./%=$(MODULE)/%),$(shell $(GO) list ./...))
test-race:
	CGO_ENABLED=1 nice -n 10 $(GO) test -race $(GOTEST_FLAGS) $(RACE_PKGS)
test-modules:
	cd deploy/validate && nice -n 10 $(GO) test $(GOTEST_FLAGS) ./...
	cd test/bench/riverbaseline && nice -n 10 $(GO) test $(GOTEST_FLAGS) ./...

# Benthos's logger methods format like fmt.Printf: vet checks their calls too
# (it cannot see through the logger's interface by itself).
VETFLAGS := -printf.funcs=Tracef,Debugf,Infof,Warnf,Errorf,Fatalf

.PHONY: lint lint-product
lint: lint-product ## go vet (every module), gofmt and forwarder lint
	cd deploy/validate && $(GO) vet $(VETFLAGS) ./...
	cd test/bench/riverbaseline && $(GO) vet $(VETFLAGS) ./...

# What make test checks: the product module's go vet, gofmt and the
# pipelines. The separate modules get go test's share of vet; their full
# vet takes most of a minute.
lint-product: build
	$(GO) vet $(VETFLAGS) ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(BIN) lint ./pipelines/...

.PHONY: chart-sync
chart-sync: ## Copy the alert rules, dashboard, pipeline and mappings into the Helm chart (deploy/helm/forwarder/files); make test fails while they are stale
	cd deploy/validate && $(GO) run ./cmd/chartsync -root $(CURDIR)

.PHONY: image
image: ## Build the container image (needs Docker): make image IMAGE=registry/forwarder:tag
	docker build --build-arg VERSION=$(VERSION) --build-arg DATE_BUILT=$(DATE) -t $(IMAGE) .

.PHONY: docs
docs: ## Regenerate docs/reference from the plugins' specs (make test fails when it is stale)
	$(GO) generate ./docs

.PHONY: bench
bench: deps build ## Benchmarks: forwarder end to end (ordering on and off) against the naive, hand-batched and River baselines in two alternated rounds, plus component benchmarks
	$(GO) run ./test/bench -rounds 2
	$(GO) test -run '^$$' -bench . -benchtime 2x ./plugins/... ./internal/...

.PHONY: clean
clean: ## Remove build output and the dev stack's data (.data/)
	rm -rf bin .data
