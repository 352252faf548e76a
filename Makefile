# The two quick-start commands: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test check install clean stress

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Everything the tests need, at the versions in constraints.txt.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,torch,jax]' tensorflow-cpu
	touch $(STAMP)

install: $(STAMP)

demo: $(BIN)/python
	$(BIN)/pip install --quiet -c constraints.txt -e '.[torch]'
	$(BIN)/nanscope demo

# Two workers, one test file each: a file's module-scoped runs are made once (files that
# record many programs run them two at a time themselves). PYTEST_WORKERS= runs serially.
PYTEST_WORKERS ?= -n 2 --dist loadfile

# The native recorder is built first (a build failure fails the tests); the
# PyTorch recorder tests then run again with the Python fallback recorder.
# The GUI's browser tests run, never skip: scripts/browser installs Debian's chromium
# where it can, or fails saying what is missing. `make test SKIP_BROWSER=1` skips them
# knowingly (pytest then lists them as skipped). The slowest tests are listed at the end
# (--durations), to keep the suite's time in view.
test: $(STAMP)
	$(if $(SKIP_BROWSER),,PYTHON=$(BIN)/python scripts/browser)
	$(BIN)/python -m nanscope.backends.torch.native
	$(if $(SKIP_BROWSER),,NANSCOPE_REQUIRE_BROWSER=1) $(BIN)/python -m pytest -q $(PYTEST_WORKERS) --durations=25
	NANSCOPE_TORCH_RECORDER=python $(BIN)/python -m pytest -q $(PYTEST_WORKERS) \
		tests/integration/test_torch_dump.py tests/integration/test_torch_models.py \
		tests/integration/test_torch_compile.py tests/integration/test_torch_context.py \
		tests/integration/test_torch_check_numerics.py \
		tests/integration/test_torch_check_numerics_lineages.py

# The recorder's switch-on-and-off test, 20 runs per recorder pinned to one core, then
# 20 more with the native recorder built with AddressSanitizer (docs/RELIABILITY.md).
ASAN = LD_PRELOAD=$$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0
stress: $(STAMP)
	$(BIN)/python -m nanscope.backends.torch.native
	NANSCOPE_STRESS_RUNS=20 $(BIN)/python -m pytest -q \
		tests/integration/test_torch_recorder_lifecycle.py -k switching
	NANSCOPE_NATIVE_SANITIZE=address $(ASAN) $(BIN)/python -m nanscope.backends.torch.native
	NANSCOPE_NATIVE_SANITIZE=address NANSCOPE_STRESS_RUNS=20 $(ASAN) $(BIN)/python -m pytest -q \
		-p no:cacheprovider tests/integration/test_torch_recorder_lifecycle.py -k "switching and native"

check: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/check

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
