# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed       # what a job needs: distrun, torch (make demo)
TESTS  := $(VENV)/.installed-test  # and what the tests, ruff and the docs use (make test, lint, docs)
# setuptools' "Editable installation" notice, a box of stars on every editable install: nothing to act on.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

.PHONY: demo test docs lint system-deps clean

# Each install step says what it does and how long it takes; pip shows its own progress.
$(STAMP): pyproject.toml
	@echo "[1/4] creating the virtualenv $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "[2/4] upgrading pip"
	$(BIN)/pip install --quiet --upgrade pip
	@echo "[3/4] installing torch 2.13.0 (the longest step: about a minute on a fresh machine)"
	$(BIN)/pip install --progress-bar on torch==2.13.0
	@echo "[4/4] installing distrun and what a job needs on this machine (py-spy, torchft)"
	$(QUIET_EDITABLE) $(BIN)/pip install --progress-bar on -e '.[train]'
	touch $@

$(TESTS): $(STAMP)
	@echo "installing what the tests and the docs use (pytest, hypothesis, ruff, mkdocs, deepspeed)"
	$(QUIET_EDITABLE) $(BIN)/pip install --progress-bar on -e '.[train,test,deepspeed]'
	touch $@

## demo: train ResNet-50 with 2 processes on this machine (no setup beyond this command)
demo: $(STAMP)
	$(BIN)/distrun launch jobs/resnet50.yaml
	$(BIN)/distrun ps
	@echo "Next: $(BIN)/distrun logs last (the job's lines); for your hosts, copy inventory/example.yaml, put in their addresses, and run $(BIN)/distrun doctor -i YOUR-COPY.yaml"

## system-deps: what the cluster tests need (sshd, pdsh, iproute2, Slurm, Chromium), installed when missing
system-deps:
	@bash tests/install-system-deps.sh

## test: the whole suite (unit + real multi-host cluster tests) and ruff
test: $(TESTS) system-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

## docs: the reference in docs/ as HTML in site/ (mkdocs --strict: a broken link or #anchor fails it)
docs: $(TESTS)
	$(BIN)/mkdocs build --strict --site-dir site

lint: $(TESTS)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build dist site *.egg-info
