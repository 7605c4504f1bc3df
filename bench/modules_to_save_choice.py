"""Why an in-place model's `modules_to_save` stay the host's own modules (ARCHITECTURE.md, "Decided (issue 45,
item 2)"): what peft's `ModulesToSaveWrapper` would change, measured on tiny random models, in seconds, on CPU.

    PYTHONPATH=. python bench/modules_to_save_choice.py [--json bench/results/modules_to_save_choice.json]

1. peft's own in-place route (`peft.inject_adapter_in_model`, LoRA, `modules_to_save=["lm_head"]`): the head is
   replaced by a wrapper, its state-dict keys change, only the copy trains.
2. A tied head (GPT-2: `lm_head.weight` is the input embedding's Parameter): ours trains it in place, so a saved
   value is the embedding's too; in peft's wrapper the copy is untied. An older file's head read into a copy alone
   (the embedding left at the base's value) gives other logits than the model that was trained: the max difference.
3. Our writer refuses a model whose head peft wrapped (`refuse_peft_heads`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings

import peft
import torch
from peft.utils import ModulesToSaveWrapper

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.zoo import gpt2, tiny_neox


def peft_in_place() -> dict:
    """What `peft.inject_adapter_in_model` does to a head named in `modules_to_save` (LoRA)."""
    cfg = peft.LoraConfig(r=2, target_modules=["query_key_value"], modules_to_save=["lm_head"])
    model = peft.inject_adapter_in_model(cfg, tiny_neox())
    return {
        "head_type": type(model.lm_head).__name__,
        "head_keys": sorted(k for k in model.state_dict() if k.startswith("lm_head")),
        "trainable_head_keys": sorted(n for n, p in model.named_parameters() if p.requires_grad and "lm_head" in n),
    }


def tied_head_read_into_copy() -> dict:
    """Max |logits difference| between a tied GPT-2 whose head trained in place (ours) and the same file's head
    value held by a copy beside an untouched embedding (peft's wrapper)."""
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(6))
    model = mmpreproj.inject(gpt2(), PreProjConfig(modules_to_save=["lm_head"])).eval()
    tied = model.lm_head.weight is model.transformer.wte.weight
    noise = torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.lm_head.weight.add_(0.05 * noise)  # "trained" in place: the embedding moves with it
        trained = model(ids).logits
        head = model.lm_head.weight.detach().clone()  # what the file holds
        model.transformer.wte.weight.copy_(gpt2().transformer.wte.weight)  # a copy leaves the original alone
        copy_logits = model.transformer(ids).last_hidden_state @ head.T
    return {"tied_in_place": tied, "max_abs_logit_diff": (copy_logits - trained).abs().max().item()}


def our_writer_on_wrapped_head() -> str:
    """What `mmpreproj.save_adapter` says of an injected model whose head peft's wrapper holds."""
    model = mmpreproj.inject(tiny_neox(), PreProjConfig(modules_to_save=["lm_head"]))
    model.lm_head = ModulesToSaveWrapper(model.lm_head, "default")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mmpreproj.save_adapter(model, tmp)
        except ValueError as e:
            return f"refused: {str(e)[:160]}"
    return "written"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    res = {
        "peft": peft.__version__,
        "peft_in_place": peft_in_place(),
        "tied_head": tied_head_read_into_copy(),
        "save_adapter_on_wrapped_head": our_writer_on_wrapped_head(),
    }
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=2)
            f.write("\n")
    return res


if __name__ == "__main__":
    main()
