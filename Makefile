# The two quick-start commands: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test check install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Everything the tests need, at the versions in constraints.txt.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,torch]' tensorflow-cpu
	touch $(STAMP)

install: $(STAMP)

demo: $(BIN)/python
	$(BIN)/pip install --quiet -c constraints.txt -e '.[torch]'
	$(BIN)/nanscope demo

# The native recorder is built first (a build failure fails the tests); the
# PyTorch recorder tests then run again with the Python fallback recorder.
test: $(STAMP)
	$(BIN)/python -m nanscope.backends.torch.native
	$(BIN)/python -m pytest -q
	NANSCOPE_TORCH_RECORDER=python $(BIN)/python -m pytest -q \
		tests/integration/test_torch_dump.py tests/integration/test_torch_models.py \
		tests/integration/test_torch_compile.py tests/integration/test_torch_context.py

check: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/check

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
