"""Generate / K/V-cache audit: `generate` and the K/V cache of injected models against references we did not write.

Run:  PYTHONPATH=. OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
        python bench/generate_audit.py [--only SUBSTR]

Written by an independent, adversarial audit from README.md, docs/peft-guide.md, docs/hosts.md, docs/limits.md,
docs/performance.md and the public docstrings (`inject`, `PreProjConfig`, `set_adapter`, mixed batches); the
expectations are the auditor's. References: transformers' own `generate` on the untouched base, a manual loop of
full forwards without cache, and peft's LoRA under the same calls. Every model is tiny, random and built in code
from a transformers config class (hidden 32, 2 layers, vocab 96); nothing is downloaded. Per family (21: gpt_neox,
llama, qwen2, qwen3, mistral, gemma, gemma2, gemma3_text, phi, phi3, gpt2, opt, falcon, stablelm, olmo2, cohere,
granite, gptj, qwen3_moe, t5 (encoder-decoder), whisper (encoder-decoder, audio)):
  * identity: `PreProjConfig(init="identity")` (W_down = 0, W_skip = 0: "outputs equal the frozen base's, bit for
              bit on most hosts") by both routes: greedy tokens equal the base's, logits and K/V bit-equal.
  * cache:    adapter weights overwritten with N(0, 0.05) noise (both routes): greedy generate with use_cache=True ==
              use_cache=False == a manual loop of full forwards (argmax); each cached step's logits vs a full
              recompute of that prefix (atol 1e-5, fp32); StaticCache (`cache_implementation="static"`) tokens ==
              dynamic; sliding-window families (mistral, gemma2, gemma3_text: window 4 < 13 tokens) included.
  * kv:       "adds nothing to the KV cache": the cache after generate has the base's tensors, shapes, dtypes and
              bytes (DynamicCache, StaticCache); at identity init its values equal the base's.
  * decode:   beam search (3 beams) cached == uncached; sampling with num_return_sequences=2 under a fixed seed:
              twice the same, and == use_cache=False; left padding (two prompts, 7 and 4 tokens): each row ==
              that row generated alone.
  * adapters: a second adapter (mmpreproj.load_adapter(adapter_name=) in place; PeftModel.add_adapter): after
              set_adapter each generates what a model holding only it generates; adapter_disabled() /
              disable_adapter() generate the base's tokens.
  * mixed:    generate(adapter_names=[...]) through a PeftModel and in place: each row == that row's adapter set
              for the whole batch; "__base__" rows == the base; beam search (names per prompt, peft expands them);
              sampling with num_return_sequences=2 (names repeated per returned sequence, as LoRA needs them).
  * save:     save_adapter/load_adapter and PeftModel.save_pretrained/from_pretrained: generate equal after reload.
  * bf16:     the model in bfloat16: cached == uncached greedy tokens (base and LoRA in bf16 as controls).
  * lora:     peft LoRA (all-linear, r=4, same noise) through the same cache, adapters and mixed calls.
A case that does not hold for the base itself (the control) is not counted against the library: it PASSes with
"(control: base/LoRA differs too)". One line per case: PASS/FAIL | area | case | details; then TOTAL and per-area
seconds. `bench/results/generate_audit_before.txt` is its output on 49119f9.

Also: generate continued from a returned cache; sliding-window families over 24 new tokens; K/V after a mixed
batch; delete_adapter / unload around generate; in place, `model(x, adapter_names=)` and a cached decode loop by
hand with it (what the docs promise in place); generate(inputs_embeds=, adapter_names=); two adapters saved by peft
and reloaded (from_pretrained + load_adapter) under a mixed generate; bf16 identity (bit) and bf16 mixed batches;
peft's task classes (task_type CAUSAL_LM / SEQ_2_SEQ_LM: their own generate) cached, K/V, mixed, mixed beam.
OLMo 2 is a documented refusal (post-norm, docs/hosts.md): one case checks the refusal; OLMo (1) runs instead.
Lines in the `lora:` areas test the reference: where LoRA itself fails they PASS marked "(reference: LoRA itself
fails here, not counted)", so the FAIL lines are the library's.

Result on commit 49119f9 (CPU, one thread, about 2 min wall): TOTAL 1596: 1571 PASS, 25 FAIL.
  * 20 library (diverges from LoRA under the same peft call; the docstrings of `_enable_peft_forward_hooks` and
    `generate_copies` say "as peft does for LoRA", which is wrong here): a mixed batch under
    `generate(do_sample=True, num_return_sequences=2)` through a PeftModel. peft's LoRA expands `adapter_names` for
    `num_beams` only, so a LoRA user passes one name per returned sequence (4 names for 2 prompts x 2); ours
    multiplies the names by num_return_sequences itself and refuses that call ("4 names (each repeated 2x for
    generate) for a batch of 2 rows", a count that misstates what was passed). Ours accepts one name per prompt,
    which LoRA refuses: the two are not interchangeable (19 decoders + whisper, whose encoder sees the expanded
    rows: "8 names for 4 rows").
  * 5 library bug: mixed batches under beam search on encoder-decoder models (t5 with and without
    num_return_sequences=2, whisper; through a plain PeftModel and PeftModelForSeq2SeqLM alike):
    the expanded names (prompt x num_beams) are handed to the encoder too, which
    runs on the unexpanded prompts, so generate raises "6 names for 2 rows in the attention of block 0 (part
    'encoder')". peft's LoRA restores the original names for the encoder and passes the same call.
    docs/peft-guide.md says mixed batches work "in generate too (also under beam search)".
Recorded as PASS with a note (not counted): generate(adapter_names=) on an `inject()`ed model is refused by
transformers ("model_kwargs are not used by the model: ['adapter_names']"), exactly as for LoRA injected in place
by peft.inject_adapter_in_model; the docs promise `model(x, adapter_names=)` in place, and that, and a cached decode
loop by hand with it, PASS on every decoder. On t5 with sampling + num_return_sequences=2 neither ours nor LoRA
accepts either naming (control). whisper's greedy generate differs from an argmax loop for the base too (its
generate applies its own logits processors; harness limit; its raw step logits match the full recompute).
Everything else held on every family: identity init bit-equal to the base (tokens, logits, K/V; fp32 and bf16, left
padding); cached == uncached == manual loop, step logits within 1e-6 of a full recompute; StaticCache; sliding
windows; K/V tensors, shapes, dtypes and bytes equal to the base's (dynamic, static, after a mixed batch): the "no
K/V-cache overhead" claim holds; beam search, sampling, left padding; set_adapter / disable / delete / unload;
mixed batches (greedy, beam, __base__, static cache, use_cache=False, inputs_embeds) on decoders; save + reload by
both routes; bf16 cached == uncached (exact tokens, like the base and LoRA controls, on these tiny models only).

Run again after the fix (bench/results/generate_audit.txt, 99 s): TOTAL 1596: 1594 PASS, 2 FAIL. The names are now
counted as peft counts LoRA's (`layer.hand_mixed_names`): repeated per beam only, an encoder-decoder's encoder given
them as passed; with sampling and num_return_sequences one name per returned row. The 2 FAILs are this harness's
expectation of the former convention (one name per prompt under sampling) on opt and qwen3_moe, where the LoRA
control fails for another reason (LoRA cannot run a mix there at all) and so does not excuse the case; on the other
19 families the same call is refused for ours and LoRA alike.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import peft  # noqa: E402
import torch  # noqa: E402
import transformers as tf  # noqa: E402
from peft import LoraConfig, PeftModel  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402

tf.logging.set_verbosity_error()
TMP = Path(tempfile.mkdtemp(prefix="generate_audit_"))
RESULTS: list[tuple[str, str, str, str]] = []
TIMES: dict[str, float] = defaultdict(float)
ONLY = None
V = 96  # vocabulary
NEW = 6  # new tokens per generate
NOISE = 0.05
ATOL = 1e-5


def record(ok, area, name, details=""):
    RESULTS.append(("PASS" if ok else "FAIL", area, name, details))
    print(f"{'PASS' if ok else 'FAIL'} | {area} | {name} | {details}", flush=True)


def case(area, name, fn):
    if ONLY and ONLY not in f"{area} {name}":
        return
    t0 = time.perf_counter()
    try:
        out = fn()
        ok, det = out if isinstance(out, tuple) else (bool(out), "")
    except Exception as e:  # noqa: BLE001
        tb = traceback.extract_tb(e.__traceback__)[-1]
        first = (str(e).strip().splitlines() or [""])[0][:200]
        ok, det = False, f"{type(e).__name__}: {first} (at {Path(tb.filename).name}:{tb.lineno})"
    if area.startswith("lora:") and not ok:  # the reference, not the library: recorded, not counted
        ok, det = True, f"(reference: LoRA itself fails here, not counted) {det}"
    record(ok, area, name, det)
    TIMES[area.split(":")[0]] += time.perf_counter() - t0


def tmp(tag):
    return Path(tempfile.mkdtemp(prefix=f"{tag}_", dir=TMP))


# ---------------------------------------------------------------- tiny models


def _ll(cfg_cls, model_cls, **kw):
    base = dict(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    base.update(kw)
    return lambda: model_cls(cfg_cls(**base))


FAMILIES = {
    "gpt_neox": lambda: tf.GPTNeoXForCausalLM(
        tf.GPTNeoXConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            rotary_pct=0.25,
            max_position_embeddings=64,
            pad_token_id=0,
        )
    ),
    "llama": _ll(tf.LlamaConfig, tf.LlamaForCausalLM),
    "qwen2": _ll(tf.Qwen2Config, tf.Qwen2ForCausalLM),
    "qwen3": _ll(tf.Qwen3Config, tf.Qwen3ForCausalLM, head_dim=8),
    "mistral": _ll(tf.MistralConfig, tf.MistralForCausalLM, sliding_window=4),
    "gemma": _ll(tf.GemmaConfig, tf.GemmaForCausalLM, head_dim=8),
    "gemma2": _ll(tf.Gemma2Config, tf.Gemma2ForCausalLM, head_dim=8, sliding_window=4),
    "gemma3_text": _ll(tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, head_dim=8, sliding_window=4),
    "phi": _ll(tf.PhiConfig, tf.PhiForCausalLM, num_key_value_heads=4, partial_rotary_factor=0.5),
    "phi3": _ll(tf.Phi3Config, tf.Phi3ForCausalLM),
    "gpt2": lambda: tf.GPT2LMHeadModel(
        tf.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=0)
    ),
    "opt": lambda: tf.OPTForCausalLM(
        tf.OPTConfig(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
            do_layer_norm_before=True,
            pad_token_id=0,
        )
    ),
    "falcon": lambda: tf.FalconForCausalLM(
        tf.FalconConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, pad_token_id=0)
    ),
    "stablelm": _ll(tf.StableLmConfig, tf.StableLmForCausalLM, num_key_value_heads=4),
    "olmo": _ll(tf.OlmoConfig, tf.OlmoForCausalLM),
    "cohere": _ll(tf.CohereConfig, tf.CohereForCausalLM),
    "granite": _ll(tf.GraniteConfig, tf.GraniteForCausalLM),
    "gptj": lambda: tf.GPTJForCausalLM(
        tf.GPTJConfig(vocab_size=V, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, pad_token_id=0)
    ),
    "qwen3_moe": _ll(
        tf.Qwen3MoeConfig,
        tf.Qwen3MoeForCausalLM,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    ),
    "t5": lambda: tf.T5ForConditionalGeneration(
        tf.T5Config(
            vocab_size=V,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=1,
        )
    ),
    "whisper": lambda: tf.WhisperForConditionalGeneration(
        tf.WhisperConfig(
            vocab_size=V,
            num_mel_bins=8,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_source_positions=8,
            max_target_positions=32,
            decoder_start_token_id=3,
            pad_token_id=0,
            bos_token_id=3,
            eos_token_id=2,
            begin_suppress_tokens=None,
            suppress_tokens=None,
        )
    ),
}
SLIDING = {"mistral", "gemma2", "gemma3_text"}
ENCDEC = {"t5", "whisper"}


def build(fam, dtype=torch.float32):
    torch.manual_seed(0)
    m = FAMILIES[fam]().eval().to(dtype)
    gc = m.generation_config
    gc.eos_token_id = None
    gc.pad_token_id = 0
    gc.do_sample = False
    for k in ("temperature", "top_p", "top_k"):
        setattr(gc, k, None)
    if fam == "whisper":
        for k in ("forced_decoder_ids", "suppress_tokens", "begin_suppress_tokens"):
            setattr(gc, k, None)
            if hasattr(m.config, k):
                setattr(m.config, k, None)
    return m


def prompts(fam, kind="equal"):
    """Model inputs as a dict. equal: (2, 7) without padding; padded: rows of 7 and 4 tokens, left padded."""
    g = torch.Generator().manual_seed(1)
    if fam == "whisper":
        feats = torch.randn(2, 8, 16, generator=g)
        return {"input_features": feats}
    ids = torch.randint(3, V, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    if kind == "padded":
        ids[1, :3] = 0
        mask[1, :3] = 0
    return {"input_ids": ids, "attention_mask": mask}


def row(inputs, i, strip_pad=True):
    """Row i alone (without its padding)."""
    out = {k: v[i : i + 1] for k, v in inputs.items()}
    if strip_pad and "attention_mask" in out:
        keep = out["attention_mask"][0].bool()
        out = {k: v[:, keep] for k, v in out.items()}
    return out


# ---------------------------------------------------------------- adapters


def adapter_params(model, name):
    """{canonical key: parameter} of adapter `name` (ours or LoRA), the key without the adapter name or peft prefix."""
    out = {}
    for n, p in model.named_parameters():
        if f".{name}." not in n + "." or not any(t in n for t in (".preproj.", ".preproj_skip.", "lora_")):
            continue
        key = n.replace(f".{name}.", ".X.").removeprefix("base_model.model.")
        out[key] = p
    return out


@torch.no_grad()
def set_noise(model, name, seed, std=NOISE):
    ps = adapter_params(model, name)
    assert ps, f"no parameters of adapter {name!r}"
    for key, p in sorted(ps.items()):
        h = int(hashlib.md5(f"{seed}:{key}".encode()).hexdigest()[:8], 16)
        g = torch.Generator().manual_seed(h)
        p.copy_((torch.randn(p.shape, generator=g) * std).to(p.dtype))
    return model


def cfg_id():
    return PreProjConfig(init="identity")


def cfg_paper():
    return PreProjConfig()


def lora_cfg():
    return LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)


def ours(fam, seed=1, route="inject", dtype=torch.float32, name="default"):
    m = build(fam, dtype)
    if route == "inject":
        m = mmpreproj.inject(m, cfg_paper(), adapter_name=name)
    else:
        m = peft.get_peft_model(m, cfg_paper(), adapter_name=name).eval()
    return set_noise(m, name, seed)


def lora(fam, seed=1, dtype=torch.float32, name="default"):
    m = peft.get_peft_model(build(fam, dtype), lora_cfg(), adapter_name=name).eval()
    return set_noise(m, name, seed)


# ---------------------------------------------------------------- generation helpers


@torch.no_grad()
def gen(model, inputs, **kw):
    kw.setdefault("max_new_tokens", NEW)
    kw.setdefault("do_sample", False)
    return model.generate(**inputs, **kw)


@torch.no_grad()
def gen_full(model, inputs, **kw):
    kw.setdefault("max_new_tokens", NEW)
    kw.setdefault("do_sample", False)
    return model.generate(**inputs, return_dict_in_generate=True, output_logits=True, **kw)


def is_encdec(model):
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


@torch.no_grad()
def full_last_logits(model, inputs, seq):
    """Logits at the last position of `seq` from one full forward without cache."""
    if is_encdec(model):
        return model(**inputs, decoder_input_ids=seq, use_cache=False).logits[:, -1]
    mask = torch.cat(
        [inputs["attention_mask"], torch.ones(seq.shape[0], seq.shape[1] - inputs["input_ids"].shape[1])], 1
    )
    return model(input_ids=seq, attention_mask=mask.long(), use_cache=False).logits[:, -1]


@torch.no_grad()
def manual_loop(model, inputs, n=NEW, start_ids=None):
    """Greedy decoding by full forwards, no cache (inputs without padding); `start_ids`: the decoder's first ids."""
    if is_encdec(model):
        start = model.generation_config.decoder_start_token_id
        seq = torch.full((next(iter(inputs.values())).shape[0], 1), start, dtype=torch.long)
        if start_ids is not None:  # whisper's generate starts from its own prompt ids
            seq = start_ids
    else:
        seq = inputs["input_ids"]
    for _ in range(n):
        nxt = full_last_logits(model, inputs, seq).argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    return seq


def cache_of(out):
    c = getattr(out, "past_key_values", None)
    if c is None:
        c = getattr(out, "cache", None)
    return c


def cache_tensors(c, prefix="c"):
    """[(path, tensor)] of every tensor in a cache object."""
    out = []
    if c is None:
        return out
    if isinstance(c, torch.Tensor):
        return [(prefix, c)]
    if isinstance(c, (tuple, list)):
        for i, x in enumerate(c):
            out += cache_tensors(x, f"{prefix}[{i}]")
        return out
    for attr in ("self_attention_cache", "cross_attention_cache"):
        if hasattr(c, attr):
            out += cache_tensors(getattr(c, attr), f"{prefix}.{attr}")
    if out:
        return out
    if hasattr(c, "layers"):
        for i, layer in enumerate(c.layers):
            for k, v in sorted(vars(layer).items()):
                if isinstance(v, torch.Tensor):
                    out.append((f"{prefix}.layers[{i}].{k}", v))
        return out
    for k, v in sorted(vars(c).items()):
        if isinstance(v, torch.Tensor):
            out.append((f"{prefix}.{k}", v))
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
            out += cache_tensors(v, f"{prefix}.{k}")
    return out


def layout(c):
    ts = cache_tensors(c)
    return [(p, tuple(t.shape), str(t.dtype)) for p, t in ts], sum(t.numel() * t.element_size() for _, t in ts)


def logit_diff(a, b, i=None):
    """Max |a - b| over the per-step logits of two generate outputs (row i only when given)."""
    if len(a.logits) != len(b.logits):
        return float("inf")
    sl = slice(None) if i is None else slice(i, i + 1)
    return max((x[sl].float() - y[sl].float()).abs().max().item() for x, y in zip(a.logits, b.logits, strict=True))


def same(a, b):
    return a.shape == b.shape and torch.equal(a, b)


def tokdiff(a, b):
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    bad = (a != b).nonzero()
    return "equal" if not len(bad) else f"{len(bad)} tokens differ, first at {tuple(bad[0].tolist())}"


def ctl(fn, *a, **kw):
    """A control's verdict (True/False), or None when the control itself raised (then nothing is excused)."""
    try:
        return bool(fn(*a, **kw)[0])
    except Exception:  # noqa: BLE001
        return None


def with_control(ok, det, control_ok, who="base"):
    """A case our model fails but the reference fails the same way is not ours: PASS, noted."""
    if ok:
        return True, det
    if control_ok is False:
        return True, f"{det} (control: {who} differs too)"
    return False, det


@contextlib.contextmanager
def seeded(s=0):
    torch.manual_seed(s)
    yield


# ---------------------------------------------------------------- checks


def check_cached_vs_uncached(make, inputs, **kw):
    m = make()
    a = gen(m, inputs, use_cache=True, **kw)
    b = gen(m, inputs, use_cache=False, **kw)
    return same(a, b), tokdiff(a, b)


def check_manual(make, inputs):
    m = make()
    a = gen(m, inputs)
    start = 1 if is_encdec(m) else inputs["input_ids"].shape[1]
    b = manual_loop(m, inputs, n=a.shape[1] - start, start_ids=a[:, :1] if is_encdec(m) else None)
    return same(a, b), tokdiff(a, b)


def check_step_logits(make, inputs, **kw):
    m = make()
    out = gen_full(m, inputs, **kw)
    seq = out.sequences
    start = 1 if is_encdec(m) else inputs["input_ids"].shape[1]
    worst = 0.0
    for t, lg in enumerate(out.logits):
        ref = full_last_logits(m, inputs, seq[:, : start + t])
        worst = max(worst, (lg.float() - ref.float()).abs().max().item())
    return worst <= ATOL, f"max |cached - full| = {worst:.2e} over {len(out.logits)} steps"


def fam_cases(fam):  # noqa: C901, PLR0915
    eq = prompts(fam, "equal")
    pad = prompts(fam, "padded") if fam != "whisper" else None
    eq16 = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in eq.items()}
    base = lambda: build(fam)  # noqa: E731
    routes = {"inject": lambda: ours(fam), "peft": lambda: ours(fam, route="peft")}

    # sanity: the noise moves the outputs
    def sanity():
        b = base()
        m = ours(fam)
        if is_encdec(b):
            dec = torch.zeros(2, 3, dtype=torch.long)
            d = (b(**eq, decoder_input_ids=dec).logits - m(**eq, decoder_input_ids=dec).logits).abs().max().item()
        else:
            d = (b(**eq).logits - m(**eq).logits).abs().max().item()
        return d > 1e-3, f"max |ours - base| logits = {d:.2e}"

    case("harness", f"{fam} | perturbed adapter changes the logits", sanity)

    # 1. identity
    for route in ("inject", "peft"):

        def ident(route=route):
            b = base()
            m = build(fam)
            m = mmpreproj.inject(m, cfg_id()) if route == "inject" else peft.get_peft_model(m, cfg_id()).eval()
            ob, om = gen_full(b, eq), gen_full(m, eq)
            ld = max((x - y).abs().max().item() for x, y in zip(ob.logits, om.logits, strict=True))
            kb, km = cache_tensors(cache_of(ob)), cache_tensors(cache_of(om))
            kv_eq = len(kb) == len(km) and all(same(x, y) for (_, x), (_, y) in zip(kb, km, strict=True))
            ok = same(ob.sequences, om.sequences) and ld == 0 and kv_eq
            return ok, f"tokens {tokdiff(ob.sequences, om.sequences)}; max logit diff {ld:.1e}; K/V bit-equal {kv_eq}"

        case("identity", f"{fam} | {route} | init=identity greedy tokens, logits, K/V == base (bit)", ident)
        if pad is not None:

            def ident_pad(route=route):
                b = base()
                m = build(fam)
                m = mmpreproj.inject(m, cfg_id()) if route == "inject" else peft.get_peft_model(m, cfg_id()).eval()
                a, c = gen(b, pad), gen(m, pad)
                return same(a, c), tokdiff(a, c)

            case("identity", f"{fam} | {route} | init=identity left-padded greedy == base", ident_pad)

    # 2. cached vs uncached vs manual, perturbed
    for route, make in routes.items():
        cb = ctl(check_cached_vs_uncached, base, eq)
        case(
            "cache",
            f"{fam} | {route} | greedy use_cache=True == use_cache=False",
            lambda make=make, cb=cb: with_control(*check_cached_vs_uncached(make, eq), cb),
        )
        mb = ctl(check_manual, base, eq)
        case(
            "cache",
            f"{fam} | {route} | greedy generate == manual loop of full forwards",
            lambda make=make, mb=mb: with_control(*check_manual(make, eq), mb),
        )
        sb = ctl(check_step_logits, base, eq)
        case(
            "cache",
            f"{fam} | {route} | each cached step's logits == full recompute (atol {ATOL:g})",
            lambda make=make, sb=sb: with_control(*check_step_logits(make, eq), sb),
        )

    # LoRA side by side (item 9 for item 2)
    lmake = lambda: lora(fam)  # noqa: E731
    case(
        "lora:cache",
        f"{fam} | LoRA greedy use_cache=True == use_cache=False",
        lambda: check_cached_vs_uncached(lmake, eq),
    )
    case("lora:cache", f"{fam} | LoRA greedy generate == manual loop", lambda: check_manual(lmake, eq))
    case("lora:cache", f"{fam} | LoRA cached step logits == full recompute", lambda: check_step_logits(lmake, eq))

    # 3. K/V layout: dynamic, static
    for route, make in routes.items():

        def kv(make=make, impl=None):
            kw = {"cache_implementation": impl} if impl else {}
            try:
                lb, bb = layout(cache_of(gen_full(base(), eq, **kw)))
            except Exception as e:  # noqa: BLE001
                return True, f"(n/a: the base refuses {impl}: {type(e).__name__})"
            lo, bo = layout(cache_of(gen_full(make(), eq, **kw)))
            ok = lb == lo and bb == bo and bb > 0
            det = f"{len(lo)} tensors, {bo} bytes vs base {len(lb)} tensors, {bb} bytes"
            if lb != lo and len(lb) == len(lo):
                det += "; first diff " + str(next((x, y) for x, y in zip(lb, lo, strict=True) if x != y))
            return ok, det

        case("kv", f"{fam} | {route} | DynamicCache tensors/shapes/dtypes/bytes == base", kv)
        if fam not in ENCDEC:
            case(
                "kv",
                f"{fam} | {route} | StaticCache tensors/shapes/dtypes/bytes == base",
                lambda kv=kv: kv(impl="static"),
            )

            def static_tokens(make=make):
                try:
                    gen(base(), eq, cache_implementation="static")
                except Exception as e:  # noqa: BLE001
                    return True, f"(n/a: the base refuses static: {type(e).__name__})"
                m = make()
                a = gen(m, eq, cache_implementation="static")
                b = gen(m, eq, use_cache=False)
                return same(a, b), tokdiff(a, b)

            case("kv", f"{fam} | {route} | StaticCache greedy == use_cache=False", static_tokens)

    # 4. decoding strategies (inject route; peft route for beam)
    for route, make in routes.items():
        bb = ctl(check_cached_vs_uncached, base, eq, num_beams=3)
        case(
            "decode",
            f"{fam} | {route} | beam search (3) cached == uncached",
            lambda make=make, bb=bb: with_control(*check_cached_vs_uncached(make, eq, num_beams=3), bb),
        )

    def sampling(make, other=True):
        m = make()
        kw = dict(do_sample=True, num_return_sequences=2, top_k=0, top_p=1.0, temperature=1.0)
        with seeded(0):
            a = gen(m, eq, **kw)
        with seeded(0):
            b = gen(m, eq, **kw)
        with seeded(0):
            c = gen(m, eq, use_cache=False, **kw)
        return same(a, b) and same(a, c), f"twice: {tokdiff(a, b)}; vs use_cache=False: {tokdiff(a, c)}"

    sb = ctl(sampling, base)
    case(
        "decode",
        f"{fam} | inject | sampling, num_return_sequences=2, seed 0: deterministic and == use_cache=False",
        lambda: with_control(*sampling(routes["inject"]), sb),
    )
    if pad is not None:

        def padded(make):
            m = make()
            a = gen(m, pad)
            dets, ok = [], True
            for i in range(2):
                r = gen(m, row(pad, i))
                ai = a[i : i + 1, -r.shape[1] :] if not is_encdec(m) else a[i : i + 1, : r.shape[1]]
                ok &= same(ai, r)
                dets.append(f"row {i}: {tokdiff(ai, r)}")
            return ok, "; ".join(dets)

        pb = ctl(padded, base)
        for route, make in routes.items():
            case(
                "decode",
                f"{fam} | {route} | left-padded batch: each row == that row alone",
                lambda make=make, pb=pb: with_control(*padded(make), pb),
            )

    # 5. several adapters
    def only(seed, route):
        return ours(fam, seed=seed, route=route)

    def two_inplace():
        d1, d2 = tmp(f"{fam}_a"), tmp(f"{fam}_b")
        mmpreproj.save_adapter(ours(fam, seed=1), d1)
        mmpreproj.save_adapter(ours(fam, seed=2), d2)
        m = mmpreproj.load_adapter(build(fam), d1)
        mmpreproj.load_adapter(m, d2, adapter_name="b")
        return m.eval()

    def two_peft(cfg_fn=cfg_paper, seed_fn=set_noise):
        m = peft.get_peft_model(build(fam), cfg_fn()).eval()
        seed_fn(m, "default", 1)
        m.add_adapter("b", cfg_fn())
        seed_fn(m, "b", 2)
        return m.eval()

    def two_lora():
        m = peft.get_peft_model(build(fam), lora_cfg()).eval()
        set_noise(m, "default", 1)
        m.add_adapter("b", lora_cfg())
        set_noise(m, "b", 2)
        return m.eval()

    def switching(make2, ref_a, ref_b, setter):
        m = make2()
        ra, rb = gen_full(ref_a(), eq), gen_full(ref_b(), eq)
        setter(m, "b")
        gb = gen_full(m, eq)
        setter(m, "default")
        ga = gen_full(m, eq)
        da, db, dab = logit_diff(ga, ra), logit_diff(gb, rb), logit_diff(ra, rb)
        ok = same(ga.sequences, ra.sequences) and same(gb.sequences, rb.sequences) and max(da, db) <= ATOL
        ok = ok and dab > 1e-4
        return ok, (
            f"a: {tokdiff(ga.sequences, ra.sequences)}, logits {da:.1e}; b: {tokdiff(gb.sequences, rb.sequences)},"
            f" logits {db:.1e}; a vs b logits differ by {dab:.1e}"
        )

    case(
        "adapters",
        f"{fam} | inject | load_adapter(adapter_name='b') + set_adapter: generate == only that adapter",
        lambda: switching(two_inplace, lambda: only(1, "inject"), lambda: only(2, "inject"), mmpreproj.set_adapter),
    )
    case(
        "adapters",
        f"{fam} | peft | add_adapter('b') + set_adapter: generate == only that adapter",
        lambda: switching(two_peft, lambda: only(1, "peft"), lambda: only(2, "peft"), lambda m, n: m.set_adapter(n)),
    )
    case(
        "lora:adapters",
        f"{fam} | LoRA add_adapter('b') + set_adapter: generate == only that adapter",
        lambda: switching(two_lora, lambda: lora(fam, 1), lambda: lora(fam, 2), lambda m, n: m.set_adapter(n)),
    )

    def disabled(make2, ctx):
        m = make2()
        ref = gen_full(base(), pad or eq)
        with ctx(m):
            a = gen_full(m, pad or eq)
        b = gen_full(m, pad or eq)
        d, de = logit_diff(a, ref), logit_diff(b, ref)
        ok = same(a.sequences, ref.sequences) and d <= ATOL and de > 1e-4
        return (
            ok,
            f"disabled vs base: {tokdiff(a.sequences, ref.sequences)}, logits {d:.1e}; enabled differs by {de:.1e}",
        )

    case(
        "adapters",
        f"{fam} | inject | adapter_disabled() generate == base",
        lambda: disabled(two_inplace, mmpreproj.adapter_disabled),
    )
    case(
        "adapters",
        f"{fam} | peft | disable_adapter() generate == base",
        lambda: disabled(two_peft, lambda m: m.disable_adapter()),
    )
    case(
        "lora:adapters",
        f"{fam} | LoRA disable_adapter() generate == base",
        lambda: disabled(two_lora, lambda m: m.disable_adapter()),
    )

    # 6. mixed batches
    def mixed(make2, setter, disabler, names, inputs, **kw):
        m = make2()
        beams = kw.get("num_beams", 1) > 1
        g = gen if beams else gen_full
        with seeded(0):
            out = g(m, inputs, adapter_names=names, **kw)
        got = out if beams else out.sequences
        nret = kw.get("num_return_sequences", 1)
        per_out = names if nret == 1 or len(names) == got.shape[0] else [n for n in names for _ in range(nret)]
        if len(per_out) != got.shape[0]:  # names per input, outputs per input x num_return_sequences
            per_out = [n for n in names for _ in range(got.shape[0] // len(names))]
        dets, ok = [], True
        refs = {}
        for n in dict.fromkeys(per_out):
            if n == "__base__":
                with disabler(m), seeded(0):
                    refs[n] = g(m, inputs, **kw)
            else:
                setter(m, n)
                with seeded(0):
                    refs[n] = g(m, inputs, **kw)
        worst = 0.0
        for i, n in enumerate(per_out):
            r = refs[n] if beams else refs[n].sequences
            ok &= same(got[i : i + 1], r[i : i + 1])
            if not same(got[i : i + 1], r[i : i + 1]):
                dets.append(f"row {i} ({n}): {tokdiff(got[i : i + 1], r[i : i + 1])}")
            if not beams:
                worst = max(worst, logit_diff(out, refs[n], i))
        ok &= worst <= ATOL
        if not beams:
            dets.append(f"max row logit diff {worst:.1e}")
        return ok, "; ".join(dets) + (f" ({got.shape[0]} rows)" if ok else "")

    mix_inputs = pad or eq

    def lora_inplace_mixed():
        """Control: peft's LoRA injected in place (inject_adapter_in_model), generate(adapter_names=...)."""
        m = build(fam)
        peft.inject_adapter_in_model(lora_cfg(), m, adapter_name="default")
        try:
            gen(m, mix_inputs, adapter_names=["default", "default"])
            return True
        except Exception:  # noqa: BLE001
            return False

    lora_inplace_ok = lora_inplace_mixed()

    def inplace_mixed(*a, **kw):
        try:
            return mixed(*a, **kw)
        except ValueError as e:
            if not lora_inplace_ok and "not used by the model" in str(e):
                return True, (
                    f"ValueError: {str(e)[:75]}... (control: LoRA in place, inject_adapter_in_model, is refused the"
                    " same; the docs promise model(x, adapter_names=) in place, not generate)"
                )
            raise

    def lora_mixes():
        try:
            return mixed(two_lora, pset, pdis, ["default", "b"], mix_inputs)[0]
        except Exception:  # noqa: BLE001
            return False

    lora_mix_ok = []

    def lora_control(label, names, **kw):
        """Control for the peft route: does LoRA (where it mixes at all) refuse the same mixed call?"""
        if label != "peft":
            return None
        if not lora_mix_ok:
            lora_mix_ok.append(lora_mixes())
        if not lora_mix_ok[0]:
            return None
        try:
            ok, _ = mixed(two_lora, pset, pdis, names, mix_inputs, **kw)
            return ok
        except Exception:  # noqa: BLE001
            return False

    def peft_mixed(label, *a, **kw):
        try:
            ok, det = mixed(*a, **kw)
        except Exception as e:  # noqa: BLE001
            ok, det = False, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        if ok:
            return ok, det
        if lora_control(label, a[3], **kw) is False:
            return True, f"{det} (control: LoRA fails the same call too)"
        return ok, det

    def runner(label):
        if label == "inject":
            return inplace_mixed
        if label == "peft":
            return lambda *a, **k: peft_mixed("peft", *a, **k)
        return mixed

    pset = lambda m, n: m.set_adapter(n)  # noqa: E731
    pdis = lambda m: m.disable_adapter()  # noqa: E731
    for label, make2, setter, disabler, area in (
        ("peft", two_peft, pset, pdis, "mixed"),
        ("inject", two_inplace, mmpreproj.set_adapter, mmpreproj.adapter_disabled, "mixed"),
        ("LoRA", two_lora, pset, pdis, "lora:mixed"),
    ):
        run = runner(label)
        case(
            area,
            f"{fam} | {label} | generate(adapter_names=['default','b']) rows == each adapter's run",
            lambda make2=make2, s=setter, d=disabler, f=run: f(make2, s, d, ["default", "b"], mix_inputs),
        )
        case(
            area,
            f"{fam} | {label} | generate(adapter_names=['b','__base__']) rows == adapter / base",
            lambda make2=make2, s=setter, d=disabler, f=run: f(make2, s, d, ["b", "__base__"], mix_inputs),
        )
        case(
            area,
            f"{fam} | {label} | beam search (3), names per prompt ['b','default']",
            lambda make2=make2, s=setter, d=disabler, f=run: f(make2, s, d, ["b", "default"], mix_inputs, num_beams=3),
        )
        case(
            area,
            f"{fam} | {label} | sampling num_return_sequences=2, names per sequence ['default']*2+['b']*2",
            lambda make2=make2, s=setter, d=disabler, f=run: f(
                make2,
                s,
                d,
                ["default", "default", "b", "b"],
                mix_inputs,
                do_sample=True,
                num_return_sequences=2,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
            ),
        )
        case(
            area,
            f"{fam} | {label} | sampling num_return_sequences=2, names per prompt ['default','b']",
            lambda make2=make2, s=setter, d=disabler, f=run: f(
                make2,
                s,
                d,
                ["default", "b"],
                mix_inputs,
                do_sample=True,
                num_return_sequences=2,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
            ),
        )

    # 6b. mixed batches, more generate settings (peft route, LoRA beside)
    for label, make2, area in (("peft", two_peft, "mixed"), ("LoRA", two_lora, "lora:mixed")):
        f = peft_mixed if label == "peft" else (lambda _label, *a, **k: mixed(*a, **k))
        case(
            area,
            f"{fam} | {label} | beam search (3) + num_return_sequences=2, names per prompt ['b','default']",
            lambda f=f, make2=make2, label=label: f(
                label, make2, pset, pdis, ["b", "default"], mix_inputs, num_beams=3, num_return_sequences=2
            ),
        )
        if fam not in ENCDEC:
            case(
                area,
                f"{fam} | {label} | generate(adapter_names=['b','default'], cache_implementation='static')",
                lambda f=f, make2=make2, label=label: f(
                    label, make2, pset, pdis, ["b", "default"], mix_inputs, cache_implementation="static"
                ),
            )
        case(
            area,
            f"{fam} | {label} | generate(adapter_names=['b','default'], use_cache=False)",
            lambda f=f, make2=make2, label=label: f(
                label, make2, pset, pdis, ["b", "default"], mix_inputs, use_cache=False
            ),
        )

    def mixed_kv():
        m = two_peft()
        lo, bo = layout(cache_of(gen_full(m, mix_inputs, adapter_names=["b", "__base__"])))
        lb, bb = layout(cache_of(gen_full(base(), mix_inputs)))
        return lo == lb and bo == bb, f"{len(lo)} tensors, {bo} bytes vs base {len(lb)} tensors, {bb} bytes"

    case("kv", f"{fam} | peft | K/V after a mixed-batch generate == base layout and bytes", mixed_kv)

    if fam not in ENCDEC:

        def continuation(make):
            m = make()
            full = gen(m, eq, max_new_tokens=NEW)
            first = gen_full(m, eq, max_new_tokens=NEW // 2)
            mask = torch.ones_like(first.sequences)
            rest = m.generate(
                input_ids=first.sequences,
                attention_mask=mask,
                past_key_values=cache_of(first),
                max_new_tokens=NEW - NEW // 2,
                do_sample=False,
            )
            return same(full, rest), tokdiff(full, rest)

        cb2 = ctl(continuation, base)
        for route, make in routes.items():
            case(
                "cache",
                f"{fam} | {route} | generate continued from a returned cache == one generate",
                lambda make=make, cb2=cb2: with_control(*continuation(make), cb2),
            )
    if fam in SLIDING:
        for route, make in routes.items():
            lb_ = ctl(check_step_logits, base, eq, max_new_tokens=24)
            case(
                "cache",
                f"{fam} | {route} | sliding window 4, 24 new tokens: cached step logits == full recompute",
                lambda make=make, lb_=lb_: with_control(*check_step_logits(make, eq, max_new_tokens=24), lb_),
            )

    # 6c. in place, what the docs promise: model(x, adapter_names=[...]); a cached decode loop by hand with it
    if fam not in ENCDEC:

        @torch.no_grad()
        def inplace_forward_mixed():
            m = two_inplace()
            got = m(**eq, adapter_names=["b", "__base__"]).logits
            mmpreproj.set_adapter(m, "b")
            rb = m(**eq).logits
            with mmpreproj.adapter_disabled(m):
                r0 = m(**eq).logits
            d = max((got[0] - rb[0]).abs().max().item(), (got[1] - r0[1]).abs().max().item())
            return d <= ATOL and (rb - r0).abs().max().item() > 1e-4, f"max row diff {d:.1e}"

        @torch.no_grad()
        def inplace_cached_loop():
            m = two_inplace()
            names = ["b", "default"]
            out = m(**eq, adapter_names=names, use_cache=True)
            seq, mask = eq["input_ids"], eq["attention_mask"]
            for _ in range(NEW):
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                seq = torch.cat([seq, nxt], 1)
                mask = torch.cat([mask, torch.ones_like(nxt)], 1)
                out = m(input_ids=nxt, attention_mask=mask, past_key_values=out.past_key_values, adapter_names=names)
            dets, ok = [], True
            for i, n in enumerate(names):
                mmpreproj.set_adapter(m, n)
                r = gen(m, eq)[i : i + 1]
                ok &= same(seq[i : i + 1], r)
                dets.append(f"row {i} ({n}): {tokdiff(seq[i : i + 1], r)}")
            return ok, "; ".join(dets)

        case(
            "mixed",
            f"{fam} | inject | model(x, adapter_names=['b','__base__']) rows == each run",
            inplace_forward_mixed,
        )
        case(
            "mixed",
            f"{fam} | inject | cached decode loop by hand with adapter_names == each adapter's generate",
            inplace_cached_loop,
        )

    # 5b. delete and unload around generate (inject route)
    def delete_then_gen():
        m = two_inplace()
        mmpreproj.set_adapter(m, "default")
        mmpreproj.delete_adapter(m, "b")
        a, r = gen_full(m, eq), gen_full(only(1, "inject"), eq)
        d = logit_diff(a, r)
        return same(a.sequences, r.sequences) and d <= ATOL, f"{tokdiff(a.sequences, r.sequences)}, logits {d:.1e}"

    def unload_then_gen():
        m = two_inplace()
        gen(m, eq)
        m = mmpreproj.unload(m) or m
        a, r = gen_full(m, eq), gen_full(base(), eq)
        d = logit_diff(a, r)
        return same(a.sequences, r.sequences) and d == 0, f"{tokdiff(a.sequences, r.sequences)}, logits {d:.1e}"

    case("adapters", f"{fam} | inject | delete_adapter('b'), then generate == only 'default'", delete_then_gen)
    case("adapters", f"{fam} | inject | unload() after generate: generate == base (bit)", unload_then_gen)

    # 8b. bf16 identity and mixed
    def ident16(route):
        b = build(fam, torch.bfloat16)
        m = build(fam, torch.bfloat16)
        m = mmpreproj.inject(m, cfg_id()) if route == "inject" else peft.get_peft_model(m, cfg_id()).eval()
        ob, om = gen_full(b, eq16), gen_full(m, eq16)
        d = logit_diff(ob, om)
        return same(ob.sequences, om.sequences) and d == 0, f"{tokdiff(ob.sequences, om.sequences)}, logits {d:.1e}"

    for route in ("inject", "peft"):
        case(
            "bf16",
            f"{fam} | {route} | bfloat16, init=identity: tokens and logits == base (bit)",
            lambda r=route: ident16(r),
        )

    def two16(kind):
        cfg = cfg_paper if kind == "ours" else lora_cfg
        m = peft.get_peft_model(build(fam, torch.bfloat16), cfg()).eval()
        set_noise(m, "default", 1)
        m.add_adapter("b", cfg())
        set_noise(m, "b", 2)
        return m.eval()

    def mixed16(kind):
        m = two16(kind)
        got = gen(m, eq16, adapter_names=["b", "default"])
        dets, ok = [], True
        for i, n in enumerate(["b", "default"]):
            m.set_adapter(n)
            r = gen(m, eq16)[i : i + 1]
            ok &= same(got[i : i + 1], r)
            dets.append(f"row {i}: {tokdiff(got[i : i + 1], r)}")
        return ok, "; ".join(dets)

    case(
        "bf16",
        f"{fam} | peft | bfloat16 mixed batch ['b','default']: rows == each adapter's run",
        lambda: mixed16("ours"),
    )
    case(
        "lora:bf16",
        f"{fam} | LoRA | bfloat16 mixed batch ['b','default']: rows == each adapter's run",
        lambda: mixed16("lora"),
    )

    # 7. save + reload
    def save_inplace():
        m = ours(fam, seed=3)
        a = gen(m, mix_inputs)
        d = tmp(f"{fam}_save")
        mmpreproj.save_adapter(m, d)
        m2 = mmpreproj.load_adapter(build(fam), d).eval()
        b = gen(m2, mix_inputs)
        return same(a, b), tokdiff(a, b)

    def save_peft():
        m = ours(fam, seed=3, route="peft")
        a = gen(m, mix_inputs)
        d = tmp(f"{fam}_psave")
        m.save_pretrained(d)
        m2 = PeftModel.from_pretrained(build(fam), d).eval()
        b = gen(m2, mix_inputs)
        return same(a, b), tokdiff(a, b)

    def save_two_peft():
        m = two_peft()
        a = gen(m, mix_inputs, adapter_names=["b", "default"])
        d = tmp(f"{fam}_p2")
        m.save_pretrained(d)  # peft: default at d, b at d/b
        m2 = PeftModel.from_pretrained(build(fam), d).eval()
        m2.load_adapter(d / "b", adapter_name="b")
        b = gen(m2, mix_inputs, adapter_names=["b", "default"])
        return same(a, b), tokdiff(a, b)

    case(
        "save",
        f"{fam} | two adapters saved, from_pretrained + load_adapter('b'): mixed generate == before",
        save_two_peft,
    )

    if fam not in ENCDEC:

        def embeds_mixed(make2):
            m = make2()
            emb = m.get_input_embeddings()(eq["input_ids"])
            kw = {"inputs_embeds": emb, "attention_mask": eq["attention_mask"]}
            got = gen(m, kw, adapter_names=["b", "default"])
            dets, ok = [], True
            for i, n in enumerate(["b", "default"]):
                m.set_adapter(n)
                r = gen(m, kw)[i : i + 1]
                ok &= same(got[i : i + 1], r)
                dets.append(f"row {i}: {tokdiff(got[i : i + 1], r)}")
            return ok, "; ".join(dets)

        case(
            "mixed",
            f"{fam} | peft | generate(inputs_embeds=..., adapter_names=[...]) rows == each run",
            lambda: embeds_mixed(two_peft),
        )
        case(
            "lora:mixed",
            f"{fam} | LoRA | generate(inputs_embeds=..., adapter_names=[...]) rows == each run",
            lambda: embeds_mixed(two_lora),
        )

    # 6d. peft's task classes (PeftModelForCausalLM / PeftModelForSeq2SeqLM): their own generate
    tt = "SEQ_2_SEQ_LM" if fam in ENCDEC else "CAUSAL_LM"

    def two_task(kind):
        def cfg():
            if kind == "ours":
                return PreProjConfig(task_type=tt)
            return LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False, task_type=tt)

        m = peft.get_peft_model(build(fam), cfg()).eval()
        set_noise(m, "default", 1)
        m.add_adapter("b", cfg())
        set_noise(m, "b", 2)
        return m.eval()

    def task_cached(kind):
        m = two_task(kind)
        a, b = gen(m, mix_inputs), gen(m, mix_inputs, use_cache=False)
        lo, bo = layout(cache_of(gen_full(m, eq)))
        lb, bb = layout(cache_of(gen_full(base(), eq)))
        ok = same(a, b) and lo == lb and bo == bb
        return ok, f"cached vs uncached: {tokdiff(a, b)}; K/V {bo} bytes vs base {bb}"

    for kind, area in (("ours", "mixed"), ("lora", "lora:mixed")):
        label = f"task_type={tt}" + (" LoRA" if kind == "lora" else "")
        case(
            area.replace("mixed", "cache"),
            f"{fam} | {label} | greedy cached == uncached, K/V layout == base",
            lambda kind=kind: task_cached(kind),
        )
        case(
            area,
            f"{fam} | {label} | generate(adapter_names=['b','default']) rows == each run",
            lambda kind=kind: mixed(lambda: two_task(kind), pset, pdis, ["b", "default"], mix_inputs),
        )
        case(
            area,
            f"{fam} | {label} | beam search (3), names per prompt ['b','__base__']",
            lambda kind=kind: mixed(lambda: two_task(kind), pset, pdis, ["b", "__base__"], mix_inputs, num_beams=3),
        )

    case("save", f"{fam} | save_adapter + load_adapter: generate == before", save_inplace)
    case("save", f"{fam} | PeftModel.save_pretrained + from_pretrained: generate == before", save_peft)

    # 8. bf16

    def bf16(make):
        m = make()
        a = gen(m, eq16, use_cache=True)
        b = gen(m, eq16, use_cache=False)
        return same(a, b), tokdiff(a, b)

    b16 = ctl(bf16, lambda: build(fam, torch.bfloat16))
    l16 = ctl(bf16, lambda: lora(fam, dtype=torch.bfloat16))
    for route in ("inject", "peft"):
        case(
            "bf16",
            f"{fam} | {route} | bfloat16 model: greedy cached == uncached",
            lambda route=route: with_control(
                *bf16(lambda: ours(fam, route=route, dtype=torch.bfloat16)),
                (False if False in (b16, l16) else b16),
                "base or LoRA",
            ),
        )
    case(
        "lora:bf16",
        f"{fam} | LoRA bfloat16: greedy cached == uncached",
        lambda: with_control(*bf16(lambda: lora(fam, dtype=torch.bfloat16)), b16),
    )


def main():
    global ONLY
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None)
    ap.add_argument("--families", default=",".join(FAMILIES))
    args = ap.parse_args()
    ONLY = args.only
    t0 = time.perf_counter()

    def olmo2_refused():
        m = _ll(tf.Olmo2Config, tf.Olmo2ForCausalLM)()
        try:
            mmpreproj.inject(m, cfg_paper())
        except Exception as e:  # noqa: BLE001
            ok = "post-norm" in str(e) and not mmpreproj.is_injected(m)
            return ok, f"(documented: docs/hosts.md, post-norm refused) {type(e).__name__}: {str(e)[:80]}"
        return False, "injected, docs/hosts.md says OLMo 2 is refused (post-norm)"

    case("harness", "olmo2 | inject refused with the reason", olmo2_refused)
    for fam in args.families.split(","):
        ft = time.perf_counter()
        try:
            build(fam)
        except Exception as e:  # noqa: BLE001
            record(False, "harness", f"{fam} | build", f"{type(e).__name__}: {str(e)[:200]}")
            continue
        fam_cases(fam)
        print(f"# {fam}: {time.perf_counter() - ft:.1f}s", flush=True)
    n = len(RESULTS)
    p = sum(r[0] == "PASS" for r in RESULTS)
    print(f"TOTAL {n}: {p} PASS, {n - p} FAIL")
    for area, s in sorted(TIMES.items()):
        print(f"# time {area}: {s:.1f}s")
    print(f"# wall {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
