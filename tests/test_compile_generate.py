"""Deployment paths of an injected decoder: `torch.compile(model)`, transformers' static-cache compiled generation,
and `torch.export` (a program that runs without mmpreproj installed).

Compiled outputs are compared to eager within a bound derived from float32 rounding: a compiler may reorder a
dot product of length K (decompositions, fused reductions), which moves it by at most K * eps * sum|a_i b_i|;
with the tiny models' widths (K <= 64), a few such steps per layer and |activations| of order 1, 4 * K * eps *
max|logits| per layer covers it (seen: 0 to 1 ulp). `aot_eager` traces through dynamo and AOTAutograd (the
graph inductor would compile) without the minutes of C++ codegen; the bench times inductor (`bench_decode.py
--compile`).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers as tf

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.procs import HANG_GUARD_S

EPS = torch.finfo(torch.float32).eps


def tiny_llama() -> tf.LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    model = mmpreproj.inject(tf.LlamaForCausalLM(cfg).eval(), PreProjConfig(skip_init_std=0.05))
    with torch.no_grad():  # away from the near-identity init, so the modules matter to the outputs
        for w in mmpreproj.injected_modules(model):
            w.slots()[0].down.weight.normal_(std=0.2)
    return model


def bound(logits: torch.Tensor, layers: int, width: int = 64) -> float:
    return 4 * width * EPS * layers * float(logits.abs().max())


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))


def test_compiled_injected_decoder_matches_eager_forward_and_cached_decode(ids):
    model = tiny_llama()
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad():
        ref = model(ids)
        out = compiled(ids)
        tol = bound(ref.logits, 2)
        torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=tol)
        nxt = ref.logits[:, -1:].argmax(-1)  # one KV-cache step through the compiled model
        step_ref = model(nxt, cache=ref.cache).logits
        torch.testing.assert_close(compiled(nxt, cache=out.cache).logits, step_ref, rtol=0, atol=tol)
    base = mmpreproj.unload(tiny_llama())
    with torch.no_grad():
        assert (base(ids).logits - ref.logits).abs().max() > 100 * tol  # the test can fail: the modules count


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_host_modules_compile_to_one_graph_in_inference(dtype):
    """No-grad inference on a half host: the weight casts are traced (no graph break, no guard per kept cast)."""
    from mmpreproj.modules import ContentSkip, PreProjection

    pp, skip = PreProjection(64), ContentSkip(64, init_std=0.05)
    x = torch.randn(2, 5, 64).to(dtype)
    with torch.no_grad():
        for m in (pp, skip):
            out = torch.compile(m, fullgraph=True, backend="eager")(x)
            assert not m.casts._casts  # the trace kept nothing (a kept cast would be guarded on per weight)
            torch.testing.assert_close(out, m(x), rtol=0, atol=0)


def test_static_cache_compiled_generation_matches_eager_generation(ids):
    model = tiny_llama()
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        eager = model.generate(ids, **kw)
        model.forward = torch.compile(model.forward, backend="aot_eager")  # transformers' documented recipe
        static = model.generate(ids, cache_implementation="static", **kw)
    assert torch.equal(static.sequences, eager.sequences)
    for got, want in zip(static.scores, eager.scores):
        torch.testing.assert_close(got, want, rtol=0, atol=bound(want, 2))


class Logits(torch.nn.Module):
    """`ids -> logits` of a causal LM, no cache: plain tensors in and out, so the exported program needs no
    transformers output class at load time (the README's export recipe)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(ids, use_cache=False).logits


@pytest.mark.slow
def test_exported_program_round_trips_and_runs_without_mmpreproj_or_transformers(ids, tmp_path):
    model = Logits(tiny_llama())
    with torch.no_grad():
        ref = model(ids)
        program = torch.export.export(model, (ids,))
        torch.testing.assert_close(program.module()(ids), ref, rtol=0, atol=0)
    torch.export.save(program, tmp_path / "model.pt2")
    torch.save({"ids": ids, "logits": ref}, tmp_path / "ref.pt")
    # a fresh interpreter where `import mmpreproj` and `import transformers` fail: the program needs torch only
    code = (
        "import sys; sys.modules['mmpreproj'] = sys.modules['transformers'] = None\n"
        "import torch\n"
        f"ref = torch.load({str(tmp_path / 'ref.pt')!r})\n"
        f"m = torch.export.load({str(tmp_path / 'model.pt2')!r}).module()\n"
        "with torch.no_grad():\n"
        "    out = m(ref['ids'])\n"
        "assert torch.equal(out, ref['logits']), (out - ref['logits']).abs().max()\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]


def test_export_under_no_grad_of_a_bf16_host_round_trips(ids):
    model = Logits(tiny_llama().to(torch.bfloat16))
    with torch.no_grad():
        ref = model(ids)
        program = torch.export.export(model, (ids,))
        out = program.module()(ids)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
