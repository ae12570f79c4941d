# The two commands of the README: `make demo` (set up + train the default agent)
# and `make test` (set up + run the test suite). Both create .venv and install
# into it. A torch already in .venv is kept; otherwise torch==2.13.0 is tried
# first (a local CPU wheel where the machine provides one), then any torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Extras the test suite exercises. alfworld builds fast-downward from source
# (cmake + g++, ~5 min the first time; pip caches the wheel afterwards). dmc is wheels only
# (dm-control + MuJoCo, ~180 MB, no build), so the DeepMind Control tests run rather than skip.
TEST_EXTRAS ?= llm,api,serve,eval,webshop,alfworld,distributed,models,tracking,export,lora,atari,dmc,openenv,dev
PYTEST_ARGS ?=
# fast-downward's build calls a bare `python`: the venv must come first on PATH.
VENV_PATH := PATH="$(abspath $(VENV))/bin:$$PATH"

.PHONY: setup setup-test fetch-models demo test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel

setup: $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0 || $(PIP) install torch
	$(VENV_PATH) $(PIP) install --quiet -e .

setup-test: setup
	@command -v bwrap >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq bubblewrap || { apt-get update -qq && apt-get install -y -qq bubblewrap; }; \
	  else echo "the code sandbox needs bubblewrap: run 'sudo apt-get install -y bubblewrap' (or your OS's package)"; fi; }
	$(VENV_PATH) $(PIP) install --quiet -e ".[$(TEST_EXTRAS)]"

demo: setup
	$(VENV)/bin/echo-rl train --config configs/minigrid_doorkey5x5.yaml

# The real pretrained model the model tests use (~90 MB download, ~2 min conversion, once per machine).
fetch-models: setup-test
	$(VENV)/bin/echo-rl models fetch smollm2-135m

test: setup-test fetch-models
	$(VENV_PATH) $(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
