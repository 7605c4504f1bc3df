"""Reference audit of the one call: is a PERTURBED adapter's output the RIGHT one?

Written by an independent audit (not by mmpreproj's authors); it reuses none of mmpreproj's placement code.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONPATH=. python bench/one_call_reference_audit.py [--only SUBSTRING]

`bench/one_call_sweep.py` checks only that an identity adapter leaves logits unchanged and a perturbed one moves
them. This script checks the perturbed output against a reference written from the paper's formula:

    x~  = x^ + W_down . SiLU(W_up . x^)        (x^: the attention's hidden-states input, after the block's norm)
    out = x + attn_out + W_skip . x~           (the skip added to the attention module's output)

For each family (tiny model built in code from its config class via `tests/helpers/trace_zoo.small`, same seed
twice, eval, fp32):
- copy A: `mmpreproj.inject(A, PreProjConfig(skip_init_std=0.05))`, every injected weight then perturbed with
  seeded noise (`W_down` and `W_skip` replaced, `W_up` moved);
- copy B: plain transformers model. Its decoder layers and each layer's attention module are located here by
  hand (paths read from each family's modeling file: `model.layers[i].self_attn`, `transformer.h[i].attn`, ...).
  A forward pre-hook replaces the attention's hidden-states input (keyword `hidden_states` or first positional)
  with `x + W_down silu(W_up x)`; a forward hook adds `W_skip x~` to the first element of the attention's output.
  Weights copied from A's wrappers in block order; the module path A wrapped must equal the path hooked in B.
- compare logits on random ids (case `plain`, batch 2 x 7), on a left-padded batch with `attention_mask`
  (case `leftpad`, compared at unmasked positions only) and in cached decoding (case `decode`: prefill 5 tokens,
  then 2 single-token steps on `past_key_values`). PASS: max |A - B| <= 1e-5 and the adapter moved the logits
  (> 1e-3 from the un-injected base). Each family goes through both entry points: `inject` and `peft`
  (`peft.get_peft_model(model, PreProjConfig(...))`).
- `control/wrong-ref` (the five families with a table row): a reference with W_down halved must differ from A,
  so the comparison is not blind.

Families: every `ok` row of `bench/results/one_call_sweep.jsonl`. BERT-style pre-LN layers (`attention` = LayerNorm
-> `self` -> `output` (dense + residual)): the paper's attn_out is after the dense projection, so the reference
adds the skip to `attention`'s output; on a FAIL the row also reports A against the skip-before-dense variant.
Nothing outside `bench/` is changed; runs in about a minute on one CPU thread.

Output lines `PASS/FAIL/SKIP | family | case | details`, then `TOTAL`.

Its run (`bench/results/one_call_reference_audit.txt`, commit 385b21b): 641 PASS, all at a difference of exactly 0;
6 SKIP where the base model itself cannot run the case (cpmant, rwkv: cached decode; glm4_moe_lite: left padding);
18 FAIL, all megatron-bert, roberta-prelayernorm and xlm-roberta-xl (3 cases x 2 entry points each): the library
adds the skip to `attention.self`'s output, ahead of `attention.output.dense`, so it computes
`x + attn_out + W_o W_skip x~` (the skip-before-dense variant matches it at 0). That run's lines:
`bench/results/one_call_reference_audit_before.txt`.

Run again after the fix (the trace sets the part's `skip_to: "attention"` there, and the skip joins `attention`'s
output, `method/layer.py: SkipJoin`): 659 PASS, 0 FAIL, the same 6 SKIP (`bench/results/one_call_reference_audit.txt`).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import traceback
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mmpreproj  # noqa: E402
from tests.helpers.trace_zoo import small  # noqa: E402

# Every `ok` row of the existing sweep (model_type, CausalLM class); families with a table row first.
SWEEP = Path(__file__).resolve().parent / "results" / "one_call_sweep.jsonl"
FIRST = ["llama", "gpt_neox", "gpt2", "qwen2", "opt"]


def families() -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in SWEEP.read_text().splitlines() if line.strip()]
    ok = [(r["type"], r["cls"]) for r in rows if r.get("stage") == "ok"]
    return sorted(ok, key=lambda r: (r[0] not in FIRST, FIRST.index(r[0]) if r[0] in FIRST else 0, r[0]))


# Where the layers live (every list found is used) and the attention attribute in a layer, read from each
# family's modeling_*.py (e.g. GPT2Block.attn, BloomBlock.self_attention, GPTNeoXLayer.attention,
# CTRL EncoderLayer.multi_head_attention, CpmAntSelfAttentionBlock.self_attention, NemotronHBlock.mixer).
LAYER_PATHS = ["model.layers", "model.decoder.layers", "transformer.h", "transformer.blocks", "gpt_neox.layers",
               "gpt_neox_japanese.layers", "biogpt.layers", "model.h", "model.vision_tower.encoder.layers",
               "model.audio_tower.layers", "model.language_model.layers", "model.L_module.layers",
               "model.H_module.layers", "rwkv.blocks", "cpmant.encoder.layers", "bert.encoder.layer",
               "roberta.encoder.layer", "roberta_prelayernorm.encoder.layer"]  # fmt: skip
ATTN_NAMES = ["self_attn", "attention", "attn", "self_attention", "multi_head_attention", "linear_attn"]
TOL = 1e-5


class _Timeout(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Timeout


def build(model_type: str, cls_name: str) -> torch.nn.Module:
    config = small(type(tf.AutoConfig.for_model(model_type)))
    torch.manual_seed(0)
    return getattr(tf, cls_name)(config).eval()


def _get(root: torch.nn.Module, dotted: str) -> torch.nn.Module | None:
    obj = root
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _layer_attention(
    layer: torch.nn.Module, where: str, inner: bool = False
) -> list[tuple[str, torch.nn.Module, torch.nn.Module]]:
    """(path, module whose input is x^, module whose output gets the skip) in one layer."""
    if hasattr(layer, "self_att"):  # CpmAnt: layernorm_before_attention -> self_attention (o_proj inside)
        return [(f"{where}.self_att.self_attention", layer.self_att.self_attention, layer.self_att.self_attention)]
    if hasattr(layer, "mixer"):  # NemotronH: one mixer per layer, attention only where block_type says so
        bt = getattr(layer, "block_type", "")
        return [(f"{where}.mixer", layer.mixer, layer.mixer)] if bt in ("attention", "full_attention") else []
    att = getattr(layer, "attention", None)
    if att is not None and hasattr(att, "self") and hasattr(att, "output"):
        # BERT-style pre-LN: attention = ln -> self (QKV + softmax, no o_proj) -> output (dense + residual). The
        # paper's attn_out is after the dense projection: x^ goes into `self`, the skip is added to `attention`'s
        # output (x + attn_out), not to `self`'s context (which the dense projection would then multiply).
        return [(f"{where}.attention.self", att.self, att.self if inner else att)]
    names = [n for n in ATTN_NAMES if isinstance(getattr(layer, n, None), torch.nn.Module)]
    if len(names) > 1:
        raise LookupError(f"{where}: several attention attrs {names}")
    return [(f"{where}.{n}", getattr(layer, n), getattr(layer, n)) for n in names]


def find_attentions(model: torch.nn.Module, inner: bool = False) -> list[tuple[str, torch.nn.Module, torch.nn.Module]]:
    """(path, pre-hook module, post-hook module) per attention block, located by the hand-read paths above."""
    out = []
    for lp in LAYER_PATHS:
        layers = _get(model, lp)
        if isinstance(layers, torch.nn.ModuleList):
            for i, layer in enumerate(layers):
                out += _layer_attention(layer, f"{lp}.{i}", inner)
    if not out:
        raise LookupError(f"no attention in a layer list at {LAYER_PATHS}")
    return out


def hook_reference(model: torch.nn.Module, weights: dict[str, tuple], inner: bool = False) -> None:
    """Paper formula via hooks, weights matched by the attention's path (`inner`: a BERT-style skip added to
    `attention.self`'s context instead, ahead of `attention.output.dense`: NOT the paper's formula, a diagnosis)."""
    for path, pre_mod, post_mod in find_attentions(model, inner):
        w_up, w_down, w_skip = weights[path]
        store: dict = {}

        def pre(mod, args, kwargs, w_up=w_up, w_down=w_down, store=store):
            if "hidden_states" in kwargs:
                x = kwargs["hidden_states"]
            elif args:
                x = args[0]
            else:
                raise LookupError(f"{type(mod).__name__} called without hidden_states: kwargs {list(kwargs)}")
            xt = x if w_up is None else x + F.linear(F.silu(F.linear(x, w_up)), w_down)
            store["xt"] = xt
            # every argument that IS x^ (CTRL passes it as v, k, q; CpmAnt as hidden_q, hidden_kv) becomes x~
            args = tuple(xt if a is x else a for a in args)
            kwargs = {k: xt if v is x else v for k, v in kwargs.items()}
            return args, kwargs

        def post(mod, args, kwargs, output, w_skip=w_skip, store=store):
            if w_skip is None:
                return output
            add = F.linear(store["xt"], w_skip)
            if isinstance(output, tuple):
                return (output[0] + add, *output[1:])
            if isinstance(output, torch.Tensor):
                return output + add
            raise LookupError(f"attention output type {type(output).__name__}")

        pre_mod.register_forward_pre_hook(pre, with_kwargs=True)
        post_mod.register_forward_hook(post, with_kwargs=True)


def perturb_and_collect(model: torch.nn.Module, seed: int = 1) -> tuple[list[tuple], list[str]]:
    """Seeded noise into every injected weight of copy A; (w_up, w_down, w_skip) and the wrapped path per block."""
    g = torch.Generator().manual_seed(seed)
    names = {id(m): n for n, m in model.named_modules()}
    weights, paths = [], []
    with torch.no_grad():
        for w in mmpreproj.injected_modules(model):
            pre, skip = w.slots()
            if pre is not None:
                pre.up.weight.add_(0.3 * torch.randn(pre.up.weight.shape, generator=g))
                pre.down.weight.copy_(0.3 * torch.randn(pre.down.weight.shape, generator=g))
            if skip is not None:
                skip.proj.weight.copy_(0.3 * torch.randn(skip.proj.weight.shape, generator=g))
            weights.append(
                (
                    None if pre is None else pre.up.weight.detach().clone(),
                    None if pre is None else pre.down.weight.detach().clone(),
                    None if skip is None else skip.proj.weight.detach().clone(),
                )
            )
            paths.append(names[id(w)])
    return weights, paths


def _logits(model: torch.nn.Module, x: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(**x)
    return out.logits if hasattr(out, "logits") else out[0]


def _inputs(model: torch.nn.Module) -> list[tuple[str, dict, torch.Tensor | None]]:
    cfg = model.config
    vocab = getattr(cfg, "vocab_size", None) or getattr(cfg.get_text_config(), "vocab_size", None) or 97
    torch.manual_seed(2)
    ids = torch.randint(1, min(vocab, 97), (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return [("plain", {"input_ids": ids}, None), ("leftpad", {"input_ids": ids, "attention_mask": mask}, mask)]


def _decode_case(rows: list, model_type: str, entry: str, a: torch.nn.Module, b: torch.nn.Module, ids, base) -> None:
    """Case `decode`: prefill 5 tokens with the KV cache, then 2 tokens one at a time; A vs B on the step logits."""
    try:
        steps = []
        for m in (base, a, b):
            with torch.no_grad():
                out = m(input_ids=ids[:, :5], use_cache=True)
                got = []
                for t in (5, 6):
                    out = m(input_ids=ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
                    got.append(out.logits)
            steps.append(torch.cat(got, 1))
    except Exception as e:  # noqa: BLE001 - a family whose tiny config has no usable cache path
        who = "the un-injected base fails alike" if not steps else "base runs, injected fails"
        rows.append(
            ("SKIP", model_type, f"{entry}/decode", f"cache forward ({who}): {type(e).__name__}: {str(e)[:90]}")
        )
        return
    diff = (steps[1] - steps[2]).abs().max().item()
    rows.append(("PASS" if diff <= TOL else "FAIL", model_type, f"{entry}/decode", f"max|A-B|={diff:.3g}"))


def audit(model_type: str, cls_name: str, entry: str) -> list[tuple[str, str, str, str]]:
    """One family through one entry point (`inject`, or `peft` = `peft.get_peft_model`) against the reference."""
    rows = []
    try:
        a, b, base = (build(model_type, cls_name) for _ in range(3))
    except Exception as e:  # noqa: BLE001 - transformers' own limits on a tiny config
        return [("SKIP", model_type, entry, f"build: {type(e).__name__}: {str(e)[:120]}")]
    config = mmpreproj.PreProjConfig(skip_init_std=0.05)
    try:
        if entry == "peft":
            from peft import get_peft_model

            a = get_peft_model(a, config)
        else:
            mmpreproj.inject(a, config)
    except (ValueError, TypeError) as e:
        return [("SKIP", model_type, entry, f"mmpreproj refused: {type(e).__name__}: {str(e)[:120]}")]
    weights, wrapped = perturb_and_collect(a)
    # the path mmpreproj wrapped, in the bare model's terms (peft's prefix and the wrapper's inner name dropped)
    norm = [p.removeprefix("base_model.model.").replace(".base_layer", "") for p in wrapped]
    try:
        hooked = [p for p, *_ in find_attentions(b)]
    except LookupError as e:
        return [("SKIP", model_type, entry, f"reference hook not placeable: {e}; mmpreproj wrapped {norm}")]
    if sorted(norm) != sorted(hooked):
        return [("FAIL", model_type, f"{entry}/paths", f"mmpreproj wrapped {norm}, reference located {hooked}")]
    hook_reference(b, dict(zip(norm, weights)))
    for case, x, m in _inputs(a):
        try:
            if case == "plain":
                _decode_case(rows, model_type, entry, a, b, x["input_ids"], base)
            l0 = None
            l0 = _logits(base, x)
            la, lb = _logits(a, x), _logits(b, x)
        except Exception as e:  # noqa: BLE001
            who = "the un-injected base fails alike" if l0 is None else "base runs, injected fails"
            rows.append(("SKIP", model_type, f"{entry}/{case}", f"forward ({who}): {type(e).__name__}: {str(e)[:90]}"))
            continue
        if m is not None:
            la, lb, l0 = la[m.bool()], lb[m.bool()], l0[m.bool()]
        diff = (la - lb).abs().max().item()
        moved = (la - l0).abs().max().item()
        verdict = "PASS" if diff <= TOL and moved > 1e-3 else "FAIL"
        detail = f"max|A-B|={diff:.3g} (adapter moved logits {moved:.3g})"
        if verdict == "FAIL" and any(pre is not post for _, pre, post in find_attentions(b)):
            # diagnosis: does A equal the skip placed on the inner attention's context (before the dense o_proj)?
            c = build(model_type, cls_name)
            hook_reference(c, dict(zip(norm, weights)), inner=True)
            lc = _logits(c, x)
            lc = lc[m.bool()] if m is not None else lc
            detail += f"; A vs skip-before-attention.output.dense variant: max diff {(la - lc).abs().max().item():.3g}"
        rows.append((verdict, model_type, f"{entry}/{case}", detail))
    return rows


def control(model_type: str, cls_name: str) -> tuple[str, str, str, str]:
    """Negative control: a reference with the pre-projection's W_down halved must differ from A (> 1e-3),
    so a PASS above is not the comparison being blind."""
    a, b = build(model_type, cls_name), build(model_type, cls_name)
    mmpreproj.inject(a, mmpreproj.PreProjConfig(skip_init_std=0.05))
    weights, wrapped = perturb_and_collect(a)
    halved = [(u, None if d is None else 0.5 * d, s) for u, d, s in weights]
    hook_reference(b, dict(zip([p.replace(".base_layer", "") for p in wrapped], halved)))
    x = _inputs(a)[0][1]
    diff = (_logits(a, x) - _logits(b, x)).abs().max().item()
    ok = diff > 1e-3
    return ("PASS" if ok else "FAIL", model_type, "control/wrong-ref", f"max|A-B'|={diff:.3g} (must be > 1e-3)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=None, help="run only families whose model_type contains SUBSTRING")
    parser.add_argument("--timeout", type=int, default=30, help="seconds per family")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    tf.logging.set_verbosity_error()
    signal.signal(signal.SIGALRM, _alarm)
    totals = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for model_type, cls_name in families():
        if args.only and args.only not in model_type:
            continue
        signal.alarm(args.timeout)
        try:
            rows = audit(model_type, cls_name, "inject") + audit(model_type, cls_name, "peft")
            if model_type in FIRST:
                rows.append(control(model_type, cls_name))
        except _Timeout:
            rows = [("SKIP", model_type, "-", f"timeout {args.timeout}s")]
        except Exception as e:  # noqa: BLE001 - a harness crash, reported as such
            tb = traceback.format_exc().strip().splitlines()[-3:]
            rows = [("SKIP", model_type, "-", f"HARNESS CRASH {type(e).__name__}: {str(e)[:100]} {tb}")]
        finally:
            signal.alarm(0)
        for r in rows:
            totals[r[0]] += 1
            print(" | ".join(r), flush=True)
    print(f"TOTAL | PASS {totals['PASS']} | FAIL {totals['FAIL']} | SKIP {totals['SKIP']}")


if __name__ == "__main__":
    main()
