"""Issue 45, item 3: which layer shape lets peft's own API drive a pre-projection adapter, alone and under LoRA.

Two toy tuners of the same math (x~ = x^ + W_down SiLU(W_up x^) into the attention, out + W_skip x~), registered
with peft like any outside method, on a tiny Llama; every peft call is run side by side with LoRA:

  A  "layer": the attention wrapper itself is peft's `BaseTunerLayer` (LoRA's shape: `q_proj` -> `lora.Linear`);
     the slots are `nn.ModuleDict`s on it, so the weights' keys keep today's layout (`self_attn.protoa_pre.default.up`)
  B  "slots": the wrapper is a plain module; the slot modules are the `BaseTunerLayer`s and hold a reference to
     their wrapper (each call is forwarded to it): today's shape with the references added

For each: peft.functional set_adapter / set_requires_grad / delete_adapter(prefix) / get_ and
set_peft_model_state_dict, in place and as a PeftModel; then LoRA stacked on the attention projections in both
orders (ours first, LoRA first): does LoRA reach q/k/v, do both run, does each unload.

    python bench/tuner_layer_choice.py      # prints the table, writes bench/results/tuner_layer_choice.json

tests/test_bench_tuner_layer_choice.py runs it and holds the decision's premises (ARCHITECTURE.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import peft
import peft.functional as pf
import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftConfig, get_peft_model, inject_adapter_in_model
from peft.tuners.tuners_utils import BaseTuner, BaseTunerLayer
from peft.utils import register_peft_method
from peft.utils.peft_types import PeftType
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mmpreproj.method.config import add_peft_type  # noqa: E402  (the enum member, as mmpreproj adds PREPROJ)


class Pre(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, d * 5 // 4, bias=False), nn.Linear(d * 5 // 4, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.up(x)))


def _swap(args: tuple, kwargs: dict, pre) -> tuple[tuple, dict, torch.Tensor]:
    if "hidden_states" in kwargs:
        x = pre(kwargs["hidden_states"])
        return args, {**kwargs, "hidden_states": x}, x
    x = pre(args[0])
    return (x, *args[1:]), kwargs, x


# --- A: the wrapper is the tuner layer ---------------------------------------------------------------------
class LayerA(nn.Module, BaseTunerLayer):
    adapter_layer_names = ("protoa_pre", "protoa_skip")

    def __init__(self, base_layer: nn.Module, adapter_name: str, d: int) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.protoa_pre, self.protoa_skip = nn.ModuleDict(), nn.ModuleDict()
        self._active_adapter = adapter_name
        self.merged_adapters = []
        self.update_layer(adapter_name, d)

    def update_layer(self, adapter_name: str, d: int) -> None:
        self.protoa_pre[adapter_name] = Pre(d)
        self.protoa_skip[adapter_name] = nn.Linear(d, d, bias=False)
        nn.init.normal_(self.protoa_pre[adapter_name].down.weight, std=0.05)
        nn.init.normal_(self.protoa_skip[adapter_name].weight, std=0.05)
        self.set_adapter(self.active_adapters)

    def forward(self, *args, **kwargs):
        if self.disable_adapters or self.active_adapters[0] not in self.protoa_pre:
            return self.base_layer(*args, **kwargs)
        name = self.active_adapters[0]
        args, kwargs, x = _swap(args, kwargs, self.protoa_pre[name])
        out = self.base_layer(*args, **kwargs)
        return (out[0] + self.protoa_skip[name](x), *out[1:])


# --- B: plain wrapper, slots are tuner layers that reach their wrapper --------------------------------------
class SlotB(nn.Module, BaseTunerLayer):
    """A slot module; peft's per-layer calls are forwarded to the wrapper it belongs to."""

    adapter_layer_names = ("inner",)

    def __init__(self, module: nn.Module, owner: WrapperB) -> None:
        super().__init__()
        self.inner = nn.ModuleDict({"x": module})
        self._owner = weakref.ref(owner)

    def set_adapter(self, adapter_names, inference_mode: bool = False) -> None:
        self._owner().set_adapter(adapter_names, inference_mode)

    def delete_adapter(self, adapter_name: str) -> None:
        self._owner().delete_adapter(adapter_name)

    def set_requires_grad(self, adapter_names, requires_grad: bool = True) -> None:
        self._owner().set_requires_grad(adapter_names, requires_grad)

    def enable_adapters(self, enabled: bool) -> None:
        self._owner().enable_adapters(enabled)

    def forward(self, x):
        return self.inner["x"](x)


class WrapperB(nn.Module):
    def get_base_layer(self) -> nn.Module:
        return self.base_layer

    def __init__(self, base_layer: nn.Module, adapter_name: str, d: int) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.protob_pre, self.protob_skip = nn.ModuleDict(), nn.ModuleDict()
        self.active, self.enabled = adapter_name, True
        self.update_layer(adapter_name, d)

    def update_layer(self, adapter_name: str, d: int) -> None:
        self.protob_pre[adapter_name] = SlotB(Pre(d), self)
        self.protob_skip[adapter_name] = SlotB(nn.Linear(d, d, bias=False), self)
        nn.init.normal_(self.protob_pre[adapter_name].inner["x"].down.weight, std=0.05)
        nn.init.normal_(self.protob_skip[adapter_name].inner["x"].weight, std=0.05)

    def set_adapter(self, names, inference_mode: bool = False) -> None:
        names = [names] if isinstance(names, str) else list(names)
        mine = [n for n in names if n in self.protob_pre]
        if mine:
            self.active = mine[0]
        for n in self.protob_pre:
            self.set_requires_grad(n, n == self.active and not inference_mode)

    def delete_adapter(self, name: str) -> None:
        if name in self.protob_pre:
            del self.protob_pre[name], self.protob_skip[name]
            if self.active == name and len(self.protob_pre):
                self.active = next(iter(self.protob_pre))

    def set_requires_grad(self, names, requires_grad: bool = True) -> None:
        names = [names] if isinstance(names, str) else list(names)
        for n in names:
            if n in self.protob_pre:
                for p in (*self.protob_pre[n].parameters(), *self.protob_skip[n].parameters()):
                    p.requires_grad_(requires_grad)

    def enable_adapters(self, enabled: bool) -> None:
        self.enabled = enabled

    def forward(self, *args, **kwargs):
        if not self.enabled or self.active not in self.protob_pre:
            return self.base_layer(*args, **kwargs)
        args, kwargs, x = _swap(args, kwargs, self.protob_pre[self.active])
        out = self.base_layer(*args, **kwargs)
        return (out[0] + self.protob_skip[self.active](x), *out[1:])


# --- the two tuners, registered as any outside method ----------------------------------------------------
@dataclass
class ProtoAConfig(PeftConfig):
    target_modules: list[str] = field(default_factory=lambda: ["self_attn"])

    def __post_init__(self) -> None:
        super().__post_init__()
        self.peft_type = PeftType.PROTOA


@dataclass
class ProtoBConfig(ProtoAConfig):
    def __post_init__(self) -> None:
        PeftConfig.__post_init__(self)
        self.peft_type = PeftType.PROTOB


def _is_attention(key: str, config) -> bool:
    return key.endswith("self_attn")


class ProtoAModel(BaseTuner):
    prefix, tuner_layer_cls, target_module_mapping = "protoa_", LayerA, {}

    def _check_target_module_exists(self, config, key: str) -> bool:
        return _is_attention(key, config)

    def _create_and_replace(self, config, adapter_name, target, target_name, parent, current_key, **_) -> None:
        d = self.model.config.hidden_size if hasattr(self.model, "config") else 32
        if isinstance(target, LayerA):
            target.update_layer(adapter_name, d)
        else:
            setattr(parent, target_name, LayerA(target, adapter_name, d))

    def _mark_only_adapters_as_trainable(self, model: nn.Module) -> None:
        for n, p in model.named_parameters():
            p.requires_grad_(self.prefix in n)

    def _prepare_adapter_config(self, config, model_config):
        return config

    def disable_adapter_layers(self) -> None:
        self._set_layers(False)

    def enable_adapter_layers(self) -> None:
        self._set_layers(True)

    def _set_layers(self, enabled: bool) -> None:
        for m in self.model.modules():
            if isinstance(m, (LayerA, WrapperB)):
                m.enable_adapters(enabled)

    def set_adapter(self, adapter_name, inference_mode: bool = False) -> None:
        pf.set_adapter(self.model, adapter_name, inference_mode=inference_mode)
        self.active_adapter = adapter_name


class ProtoBModel(ProtoAModel):
    prefix, tuner_layer_cls = "protob_", SlotB

    def _create_and_replace(self, config, adapter_name, target, target_name, parent, current_key, **_) -> None:
        d = self.model.config.hidden_size if hasattr(self.model, "config") else 32
        if isinstance(target, WrapperB):
            target.update_layer(adapter_name, d)
        else:
            setattr(parent, target_name, WrapperB(target, adapter_name, d))


for name, cfg, model in (("protoa", ProtoAConfig, ProtoAModel), ("protob", ProtoBConfig, ProtoBModel)):
    add_peft_type(name.upper())
    register_peft_method(name=name, config_cls=cfg, model_cls=model, prefix=model.prefix)


# --- the checks ----------------------------------------------------------------------------------------------
def tiny() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


X = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))


def out(m: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return m(input_ids=X).logits


def randomize(m: nn.Module, prefix: str) -> None:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if prefix in n:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def adapter_params(m: nn.Module, prefix: str, name: str) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in m.named_parameters() if prefix in n and f".{name}." in n]


def functional_calls(kind: str, make, prefix: str, route: str) -> dict[str, str]:
    """Each peft.functional call on a model with adapters "a" and "b": does it do what it does for LoRA?"""
    res: dict[str, str] = {}
    m = tiny()
    if route == "inplace":
        m = inject_adapter_in_model(make(), m, adapter_name="a")
        m = inject_adapter_in_model(make(), m, adapter_name="b")
    else:
        m = get_peft_model(m, make(), adapter_name="a")
        m.add_adapter("b", make())
    randomize(m, prefix)
    try:
        pf.set_adapter(m, "a")
        ya = out(m)
        pf.set_adapter(m, "b")
        yb = out(m)
        pf.set_adapter(m, "a")
        res["set_adapter"] = "switches" if not torch.equal(ya, yb) and torch.equal(ya, out(m)) else "no effect"
    except Exception as e:  # noqa: BLE001 - recorded
        res["set_adapter"] = f"{type(e).__name__}: {str(e)[:80]}"
    try:
        pf.set_requires_grad(m, "b", requires_grad=True)
        on = all(p.requires_grad for _, p in adapter_params(m, prefix, "b"))
        pf.set_requires_grad(m, "b", requires_grad=False)
        off = not any(p.requires_grad for _, p in adapter_params(m, prefix, "b"))
        res["set_requires_grad"] = "works" if on and off else "no effect"
    except Exception as e:  # noqa: BLE001
        res["set_requires_grad"] = f"{type(e).__name__}: {str(e)[:80]}"
    try:
        sd = {k: v.clone() for k, v in pf.get_peft_model_state_dict(m, adapter_name="a").items()}
        n_a = len(adapter_params(m, prefix, "a"))
        res["get_peft_model_state_dict"] = f"{len(sd)} of {n_a} tensors"
        before = out(m)
        with torch.no_grad():
            for _, p in adapter_params(m, prefix, "a"):
                p.zero_()
        r = pf.set_peft_model_state_dict(m, sd, adapter_name="a")
        unexpected = getattr(r, "unexpected_keys", [])
        res["set_peft_model_state_dict"] = (
            "round trip exact"
            if torch.equal(before, out(m)) and not unexpected
            else f"differs ({len(unexpected)} unexpected)"
        )
    except Exception as e:  # noqa: BLE001
        res["get/set_peft_model_state_dict"] = f"{type(e).__name__}: {str(e)[:80]}"
    try:
        pf.delete_adapter(m, "b", prefix=prefix)
        left = len(adapter_params(m, prefix, "b"))
        res["delete_adapter"] = "deletes" if left == 0 else f"no effect ({left} tensors left)"
    except Exception as e:  # noqa: BLE001
        res["delete_adapter"] = f"{type(e).__name__}: {str(e)[:80]}"
    return res


def stacking(kind: str, make, prefix: str) -> dict[str, str]:
    """LoRA on q/k/v together with ours, in both orders."""
    lora = lambda: LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj"], init_lora_weights=False)  # noqa: E731
    res = {}
    base = out(tiny())
    # ours first, then LoRA (today's preproj_lora order)
    m = inject_adapter_in_model(make(), tiny(), adapter_name="default")
    randomize(m, prefix)
    ours = out(m)
    try:
        m = inject_adapter_in_model(lora(), m, adapter_name="lora")
        n_lora = sum("lora_A" in n for n, _ in m.named_parameters())
        both = out(m)
        res["ours then LoRA"] = f"LoRA reaches {n_lora // 1} of 6 projections" + (
            "; both run" if n_lora and not torch.equal(both, ours) else ""
        )
    except Exception as e:  # noqa: BLE001
        res["ours then LoRA"] = f"{type(e).__name__}: {str(e)[:80]}"
    # LoRA first, then ours around the attention that holds it
    m = get_peft_model(tiny(), lora())
    lora_only = out(m)
    try:
        inject_adapter_in_model(make(), m.base_model.model, adapter_name="pp")
        randomize(m, prefix)
        both = out(m)
        n_ours = sum(isinstance(x, (LayerA, WrapperB)) for x in m.modules())
        res["LoRA then ours"] = f"ours at {n_ours} of 2 attentions" + (
            "; both run" if not torch.equal(both, lora_only) else ""
        )
        for key, mod in list(m.named_modules()):  # ours off first (the stacked class's unload), then LoRA's
            if isinstance(mod, (LayerA, WrapperB)):
                parent, _, attr = key.rpartition(".")
                setattr(m.get_submodule(parent), attr, mod.base_layer)
        u = m.unload()
        left_lora = sum("lora_" in n for n, _ in u.named_parameters())
        left_ours = sum(prefix in n for n, _ in u.named_parameters())
        res["ours off, then LoRA's unload()"] = f"{left_lora} LoRA, {left_ours} of ours tensors left" + (
            "; base restored" if torch.equal(out(u), base) else "; base differs"
        )
    except Exception as e:  # noqa: BLE001
        res["LoRA then ours"] = f"{type(e).__name__}: {str(e)[:80]}"
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "tuner_layer_choice.json")
    args = ap.parse_args()
    rows = {}
    lora = lambda: LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)  # noqa: E731
    for kind, make, prefix in (
        ("LoRA (reference)", lora, "lora_"),
        ("A: wrapper is the tuner layer", ProtoAConfig, "protoa_"),
        ("B: slots reach their wrapper", ProtoBConfig, "protob_"),
    ):
        for route in ("inplace", "peftmodel"):
            rows[f"{kind} / {route}"] = functional_calls(kind, make, prefix, route)
        if not kind.startswith("LoRA"):
            rows[f"{kind} / with LoRA"] = stacking(kind, make, prefix)
    for k, v in rows.items():
        print(k)
        for c, r in v.items():
            print(f"    {c:28s} {r}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"peft": peft.__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
