# Two commands for a fresh machine with only Python: `make demo` and `make test`.
# The venv keeps an installed torch: torch is installed first, pinned to the local CPU wheel when one
# is offered (TORCH_SPEC), so the project's `torch>=` lower bound never pulls a CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-all install lint docs docs-serve screenshots dist clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)" || $(PY) -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tscope demo

# `make test`: the suite without the tests marked slow (a few minutes on 2 cores); `make test-all`: every test
# (the multi-process DDP/FSDP fits, inductor, packaging, the GPU scripts' CPU smoke), before each release
# (PYTEST_WORKERS processes, each test file in one of them; PYTEST_WORKERS=0: one process)
PYTEST_WORKERS ?= 2
PYTEST_RUN = $(PY) -m pytest -q -p no:cacheprovider \
	$(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(STAMP)
	$(PYTEST_RUN) -m "not slow" $(PYTEST_ARGS)

test-all: $(STAMP)
	$(PYTEST_RUN) $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check tscope_callbacks tests benchmarks scripts docs_theme

# the documentation site (mkdocs.yml, pages under docs/), built into build/site; --strict: a broken link fails
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir build/site
	@echo "Open build/site/index.html in a browser (it works from disk and offline, search included)"

docs-serve: $(STAMP)
	$(VENV)/bin/mkdocs serve

# every PNG of the README and docs/ from the current code (a demo fit, TensorBoard, the dashboard page in headless
# Chromium) and docs/screenshots.json, the hashes tests/test_screenshots.py checks them against
screenshots: $(STAMP)
	$(PY) scripts/screenshots.py

# a wheel and an sdist in dist/ (pip install -c <torch pin> dist/tscope_callbacks-*.whl: see the README)
dist: $(STAMP)
	$(PY) -m build --outdir dist

clean:
	rm -rf $(VENV) build dist *.egg-info
