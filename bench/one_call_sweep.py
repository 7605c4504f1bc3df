"""The one call (`peft.get_peft_model(model, PreProjConfig())`) over every class of a transformers auto mapping
(default: the causal LMs), each built tiny from its config class in code (`tests/helpers/trace_zoo.small`: 2
layers, width 32; never downloaded; a VLM's image token id moved into the tiny vocabulary, as a real model has it).

    python bench/one_call_sweep.py [--mapping MODEL_FOR_CAUSAL_LM_MAPPING_NAMES] [--start 0] [--stop N] > sweep.jsonl

Causal LMs run on random `input_ids`; any other mapping (`MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`,
`MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES`, ...) on the library's own `example_input(model)`, every returned
tensor compared.

A coverage probe, not a timing: one JSON line per model type with its stage, and a summary on stderr.
- `ok`: injected; `identity_equal` (an identity-init adapter returns the base's logits, fp32 1e-5) and
  `perturbed_differs` (a perturbed adapter changes them) must both be true, else the row is silently wrong;
  `wrappers` counts the injected attention blocks.
- `refused`: a ValueError / TypeError naming why (post-norm, no norm -> attention seam, ...).
- `build` / `base-forward`: transformers cannot build or run that tiny config (not ours to judge).
- `crash` / `timeout`: anything else.
Two single-thread processes over halves of the list (`--start/--stop`) halve the wall time on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import signal
import sys
import warnings
from pathlib import Path

import torch
import transformers as tf
from peft import get_peft_model
from transformers.models.auto import modeling_auto

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402
from mmpreproj.hosts.example_input import example_input  # noqa: E402
from tests.helpers.adapter_weights import perturb_adapters  # noqa: E402
from tests.helpers.host_contract import flat  # noqa: E402
from tests.helpers.trace_zoo import small  # noqa: E402


class _Timeout(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Timeout


def _outputs(model: torch.nn.Module, x: dict) -> torch.Tensor:
    """Every tensor `model(**x)` returns, flattened (logits alone for a causal LM)."""
    out = model(**x)
    return out.logits if "input_ids" in x and len(x) == 1 else flat(out)


def probe(model_type: str, cls_name: str, causal: bool) -> dict:
    """One model type through the one call: its stage and, injected, the identity and perturbation checks."""
    row: dict = {"type": model_type, "cls": cls_name}
    try:
        config_cls = type(tf.AutoConfig.for_model(model_type))
        config = small(config_cls)
        tokens = {k: 90 for k in ("image_token_id", "image_token_index") if isinstance(getattr(config, k, None), int)}
        config = small(config_cls, **tokens) if tokens else config
        torch.manual_seed(0)
        model = getattr(tf, cls_name)(config).eval()
    except Exception as e:  # noqa: BLE001 - transformers' own limits on a tiny config
        return {**row, "stage": "build", "err": f"{type(e).__name__}: {str(e)[:150]}"}
    try:
        if causal:
            x = {"input_ids": torch.randint(1, min(getattr(config, "vocab_size", None) or 97, 97), (2, 7))}
        else:
            x = example_input(model)
        with torch.no_grad():
            ref = _outputs(model, x)
    except Exception as e:  # noqa: BLE001
        return {**row, "stage": "base-forward", "err": f"{type(e).__name__}: {str(e)[:150]}"}
    try:
        tuned = get_peft_model(copy.deepcopy(model), PreProjConfig(init="identity", skip_init_std=0.0))
    except (ValueError, TypeError) as e:
        return {**row, "stage": "refused", "err": f"{type(e).__name__}: {str(e)[:200]}"}
    with torch.no_grad():
        got = _outputs(tuned, x)
        same = got.shape == ref.shape and torch.allclose(got, ref, atol=1e-5)
        perturb_adapters(tuned, seed=1)
        got = _outputs(tuned, x)
        moved = not (got.shape == ref.shape and torch.allclose(got, ref, atol=1e-4))
    wrappers = len(mmpreproj.injected_modules(tuned))
    return {**row, "stage": "ok", "identity_equal": bool(same), "perturbed_differs": moved, "wrappers": wrappers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mapping", default="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", help="a transformers auto mapping")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--stop", type=int, default=None)
    parser.add_argument("--timeout", type=int, default=90, help="seconds per model type")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    signal.signal(signal.SIGALRM, _alarm)
    stages: collections.Counter = collections.Counter()
    silent = []
    mapping = getattr(modeling_auto, args.mapping)
    causal = args.mapping == "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
    for model_type, cls_name in sorted(mapping.items())[args.start : args.stop]:
        cls_name = cls_name[0] if isinstance(cls_name, (tuple, list)) else cls_name
        signal.alarm(args.timeout)
        try:
            row = probe(model_type, cls_name, causal)
        except _Timeout:
            row = {"type": model_type, "cls": cls_name, "stage": "timeout"}
        except Exception as e:  # noqa: BLE001 - a crash is a finding, reported in the row
            row = {"type": model_type, "cls": cls_name, "stage": "crash", "err": f"{type(e).__name__}: {e}"[:200]}
        finally:
            signal.alarm(0)
        stages[row["stage"]] += 1
        if row["stage"] == "ok" and not (row["identity_equal"] and row["perturbed_differs"]):
            silent.append(model_type)
        print(json.dumps(row), flush=True)
    print(f"{sum(stages.values())} model types: {dict(stages)}; silently wrong: {silent or 'none'}", file=sys.stderr)


if __name__ == "__main__":
    main()
