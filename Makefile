# Two entry points, each doing its own set-up in a local venv:
#   make demo   the offline main job (mini reproduction of the paper's Table 2)
#   make test   the test suite (CPU only, offline)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mmpreproj demo

test: $(STAMP)
	$(VENV)/bin/pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
