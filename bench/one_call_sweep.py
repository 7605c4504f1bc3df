"""The one call (`peft.get_peft_model(model, PreProjConfig())`) over every causal-LM class transformers has, each built
tiny from its config class in code (`tests/helpers/trace_zoo.small`: 2 layers, width 32; never downloaded).

    python bench/one_call_sweep.py [--start 0] [--stop 200] [--timeout 90] > sweep.jsonl

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
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402
from tests.helpers.adapter_weights import perturb_adapters  # noqa: E402
from tests.helpers.trace_zoo import small  # noqa: E402


class _Timeout(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Timeout


def probe(model_type: str, cls_name: str) -> dict:
    """One model type through the one call: its stage and, injected, the identity and perturbation checks."""
    row: dict = {"type": model_type, "cls": cls_name}
    try:
        config = small(type(tf.AutoConfig.for_model(model_type)))
        torch.manual_seed(0)
        model = getattr(tf, cls_name)(config).eval()
    except Exception as e:  # noqa: BLE001 - transformers' own limits on a tiny config
        return {**row, "stage": "build", "err": f"{type(e).__name__}: {str(e)[:150]}"}
    ids = torch.randint(1, min(getattr(config, "vocab_size", None) or 97, 97), (2, 7))
    try:
        with torch.no_grad():
            ref = model(input_ids=ids).logits
    except Exception as e:  # noqa: BLE001
        return {**row, "stage": "base-forward", "err": f"{type(e).__name__}: {str(e)[:150]}"}
    try:
        tuned = get_peft_model(copy.deepcopy(model), PreProjConfig(init="identity", skip_init_std=0.0))
    except (ValueError, TypeError) as e:
        return {**row, "stage": "refused", "err": f"{type(e).__name__}: {str(e)[:200]}"}
    with torch.no_grad():
        same = torch.allclose(tuned(input_ids=ids).logits, ref, atol=1e-5)
        perturb_adapters(tuned, seed=1)
        moved = not torch.allclose(tuned(input_ids=ids).logits, ref, atol=1e-4)
    wrappers = len(mmpreproj.injected_modules(tuned))
    return {**row, "stage": "ok", "identity_equal": same, "perturbed_differs": moved, "wrappers": wrappers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--stop", type=int, default=None)
    parser.add_argument("--timeout", type=int, default=90, help="seconds per model type")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    signal.signal(signal.SIGALRM, _alarm)
    stages: collections.Counter = collections.Counter()
    silent = []
    for model_type, cls_name in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items())[args.start : args.stop]:
        signal.alarm(args.timeout)
        try:
            row = probe(model_type, cls_name)
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
