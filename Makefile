# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint system-deps clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[train,test]'
	touch $@

## demo: train ResNet-50 with 2 processes on this machine (no setup beyond this command)
demo: $(STAMP)
	$(BIN)/distrun launch jobs/resnet50.yaml
	$(BIN)/distrun ps

## system-deps: what the cluster tests need (sshd, pdsh, iproute2, Slurm, Chromium), installed when missing
system-deps:
	@bash tests/install-system-deps.sh

## test: the whole suite (unit + real multi-host cluster tests) and ruff
test: $(STAMP) system-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
