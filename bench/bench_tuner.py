"""The peft route costs nothing at run time: `get_peft_model` vs `inject` vs the paper's modules as plain hooks.

    python bench/bench_tuner.py [--shape 160m|410m] [--seq 512] [--batch 1] [--repeats 7]

Random weights, CPU fp32, no downloads. Four models of one Pythia shape, timed round-robin in one process
(`common.interleaved_medians`):
- "base": the GPT-NeoX model alone;
- "inject": `mmpreproj.inject(base)` (our wrapper around each attention);
- "peft": `peft.get_peft_model(base, PreProjConfig())` (the same wrapper behind peft's `PeftModel`);
- "authors": the paper's modules written the plain way, the way a research code base adds them: per block a
  forward pre-hook on the attention that turns its input x^ into x~ = x^ + W_down SiLU(W_up x^) and a forward
  hook that adds W_skip x~ to its output; no wrapper, no observers, no checks.
Printed: forward (no grad) over the base beside the matmul FLOP ratio, and one frozen-probe training step
(forward + backward + AdamW on the adapter weights, base frozen) of each injected variant over "authors".
"""

from __future__ import annotations

import argparse
import copy
import json

import peft
import torch
from common import PYTHIA_SHAPES, count_flops, interleaved_medians, machine, write_json
from torch import nn
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

import mmpreproj


class AuthorsModules(nn.Module):
    """x~ = x^ + W_down SiLU(W_up x^) (W_up: d -> 1.25 d) and W_skip x~, both without bias."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, int(1.25 * dim), bias=False)
        self.down = nn.Linear(int(1.25 * dim), dim, bias=False)
        self.skip = nn.Linear(dim, dim, bias=False)
        for w, std in ((self.up.weight, 0.01), (self.down.weight, 0.01), (self.skip.weight, 1e-4)):
            nn.init.normal_(w, std=std)

    def pre(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, d) -> (B, N, d)
        return x + self.down(nn.functional.silu(self.up(x)))


def add_authors_modules(model: GPTNeoXForCausalLM) -> list[AuthorsModules]:
    """Freeze `model` and hook the paper's modules onto every attention (in place); returns the modules."""
    model.requires_grad_(False)
    added = []
    for layer in model.gpt_neox.layers:
        mods = AuthorsModules(model.config.hidden_size)
        layer.attention.add_module("authors", mods)
        seen: dict[str, torch.Tensor] = {}

        def pre_hook(module, args, kwargs, mods=mods, seen=seen):
            if "hidden_states" in kwargs:
                seen["x"] = kwargs["hidden_states"] = mods.pre(kwargs["hidden_states"])
                return args, kwargs
            seen["x"] = x = mods.pre(args[0])
            return (x, *args[1:]), kwargs

        def hook(module, args, kwargs, out, mods=mods, seen=seen):
            return (out[0] + mods.skip(seen.pop("x")), *out[1:])

        layer.attention.register_forward_pre_hook(pre_hook, with_kwargs=True)
        layer.attention.register_forward_hook(hook, with_kwargs=True)
        added.append(mods)
    return added


def copy_into_authors(authors: GPTNeoXForCausalLM, injected: nn.Module) -> None:
    """Copy the injected weights of `injected` into the authors' modules of `authors` (block by block), so the two
    compute the same outputs."""
    mods = [layer.attention.authors for layer in authors.gpt_neox.layers]
    with torch.no_grad():
        for m, w in zip(mods, mmpreproj.injected_modules(injected), strict=True):
            pre, skip = w.slots()
            m.up.weight.copy_(pre.up.weight)
            m.down.weight.copy_(pre.down.weight)
            m.skip.weight.copy_(skip.proj.weight)


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(PYTHIA_SHAPES), default="160m")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, **PYTHIA_SHAPES[args.shape])
    base = GPTNeoXForCausalLM(cfg).eval()
    models = {
        "base": base,
        "inject": mmpreproj.inject(copy.deepcopy(base)),
        "peft": peft.get_peft_model(copy.deepcopy(base), mmpreproj.PreProjConfig()),
        "authors": copy.deepcopy(base),
    }
    add_authors_modules(models["authors"])
    copy_into_authors(models["authors"], models["inject"])  # the same weights, so the outputs can be compared
    with torch.no_grad():
        for mine, w in zip(mmpreproj.injected_modules(models["peft"]), mmpreproj.injected_modules(models["inject"])):
            mine.load_state_dict(w.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # the hooks compute what the wrapper computes: the same logits, to fp32 rounding
        for name in ("inject", "peft"):
            torch.testing.assert_close(models[name](ids).logits, models["authors"](ids).logits, atol=1e-3, rtol=1e-3)

    def forward(model):
        def run():
            with torch.no_grad():
                model(ids)

        return run

    def train_step(model):
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4)

        def run():
            loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return run

    flops = {k: count_flops(forward(m)) for k, m in models.items()}
    fwd = interleaved_medians({k: forward(m) for k, m in models.items()}, repeats=args.repeats)
    for m in models.values():
        m.train()
    step = interleaved_medians({k: train_step(models[k]) for k in ("inject", "peft", "authors")}, repeats=args.repeats)
    result = {
        "machine": machine(),
        "shape": args.shape,
        "seq": args.seq,
        "batch": args.batch,
        "repeats": args.repeats,
        "flop_ratio": flops["inject"] / flops["base"],
        "forward_over_base": {k: fwd[k] / fwd["base"] for k in ("inject", "peft", "authors")},
        "step_over_authors": {k: step[k] / step["authors"] for k in ("inject", "peft")},
        "seconds": {"forward": fwd, "step": step},
    }
    print(json.dumps(result, indent=2))
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
