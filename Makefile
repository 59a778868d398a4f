# Two entry points, both doing their own set-up on a fresh machine:
#   make demo   - create .venv if missing, install, run the default benchmark and print the comparison
#   make test   - same set-up, lint, then the whole test suite as CI runs it (tests/suite.py: the wall-clock
#                 tests alone, then the SLURM tests beside the others; each part prints its slowest tests)
# make test-fast is the inner loop: the tests not marked slow, slurm or mpi (docs/architecture.md, "Tests").
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
TORCH  ?= torch==2.13.0
# The Python that creates .venv: make PYTHON=python3.12 demo where python3 is older than the floor.
PYTHON ?= python3
# pyproject.toml's requires-python, checked before anything is installed: an older python3
# (Ubuntu 22.04's 3.10) installed torch and then failed in pip, leaving a .venv that failed again.
PY_FLOOR := $(shell sed -n 's/^requires-python = ">=\([0-9.]*\)"$$/\1/p' pyproject.toml)
# A venv cannot move: its scripts name the interpreter by the path it was made at, so after the
# clone was moved or renamed `make test` failed in "lint-imports: No such file or directory".
# The stamp holds where it was made.
MADE_AT := $(shell sed -n 1p '$(STAMP)' 2>/dev/null)
ifneq ($(MADE_AT),)
ifeq ($(filter clean,$(MAKECMDGOALS)),)
ifneq ($(MADE_AT),$(shell cd '$(VENV)' && pwd -P))
$(error $(VENV) was made at $(MADE_AT) and cannot move with the clone: remove it (rm -rf $(VENV)) and run make again)
endif
endif
endif
# $(1): a Python; $(2): what to do where it is older than the floor (one line, exit status 2).
at_least_floor = '$(1)' -c 'import sys; ok = sys.version_info[:2] >= tuple(map(int, "$(PY_FLOOR)".split("."))); \
	ok or print("make: %s is Python %s; odc-bench needs Python $(PY_FLOOR) or newer: %s" \
	% (sys.argv[1], sys.version.split()[0], sys.argv[2]), file=sys.stderr); sys.exit(0 if ok else 2)' '$(1)' '$(2)'

.PHONY: demo test test-fast figures figures-docs lint setup clean gpu-check gpu-wheels gpu-command

setup: $(STAMP)

# A venv left half made (Debian's python3 without python3-venv: no pip in it) failed every later
# make in "No module named pip", also once python3-venv was installed: it is removed.
$(STAMP): pyproject.toml
	@if test -x $(PY); then $(call at_least_floor,$(PY),remove $(VENV) (rm -rf $(VENV)) and run make again with PYTHON set to a newer one (PYTHON=python$(PY_FLOOR))); \
	else $(call at_least_floor,$(PYTHON),install a newer one and run make again with PYTHON set to it (PYTHON=python$(PY_FLOOR))); fi
	test -x $(PY) || '$(PYTHON)' -m venv $(VENV) || { rm -rf $(VENV); exit 2; }
	@$(PY) -m pip --version > /dev/null 2>&1 || { echo "make: $(VENV) has no pip, which make installs with (a venv \
	made without it, as uv venv makes them): add it ($(PY) -m ensurepip), or remove $(VENV) (rm -rf $(VENV)) and run \
	make again" >&2; exit 2; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	(cd '$(VENV)' && pwd -P) > '$(STAMP)'

demo: $(STAMP)
	$(PY) -m odc_bench sweep=demo
	$(PY) -m odc_bench.results compare results/local/demo

test: lint
	$(PY) -m tests.suite

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not slurm and not mpi"

figures: $(STAMP)
	$(PY) -m paper_figures

# The README's small PNGs (docs/figures/), from the committed results.
figures-docs: $(STAMP)
	$(PY) -m paper_figures --docs

# ruff, the shape contracts (pyproject's [tool.importlinter]) and the type checker.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# The one script for a GPU machine (docs/gpu.md): at most 6 minutes on one GPU, results under
# results/gpu/<device>-<date>/. No set-up: a GPU machine's own python3 with torch (the project's
# other needs on PYTHONPATH); without a GPU it says so and exits 0.
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	$(GPU_PY) -m odc_bench.tools.gpu_check

# What a GPU machine without package registries lacks, as wheels in .whl/ (ignored by git): carry
# .whl there and install it with pip --target (docs/gpu.md gives the whole command).
GPU_WHEELS := hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 submitit==1.5.4 hydra-submitit-launcher==1.2.0 joblib==1.6.0
gpu-wheels: $(STAMP)
	rm -rf .whl && $(PY) -m pip wheel -q --no-deps -w .whl $(GPU_WHEELS)

# The one command to give the lent machine (docs/gpu.md), with this checkout's commit and wheels.
gpu-command: gpu-wheels
	@$(PY) -m odc_bench.tools.gpu_check --command

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
