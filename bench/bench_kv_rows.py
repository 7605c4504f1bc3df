"""KV-cache bytes of an injected decoder over its base, one `generate` per decoder row of `mmpreproj.hosts`.

    python bench/bench_kv_rows.py [--new-tokens 4] [--json out.json]

Each transformers decoder family that has a row (and GPT-NeoX, and the Qwen2-VL / Qwen2.5-VL language model,
text only) is built tiny from its config in code (random weights, width 64, 2 layers), injected with the paper's
init, and asked for the same greedy `generate`; the ratio of the returned caches' bytes must be exactly 1.000:
the pre-projection and the skip add no keys or values.
"""

from __future__ import annotations

import argparse
import copy

import torch
import transformers as tf
from common import machine, write_json

import mmpreproj

VOCAB = 97
_LLAMA_LIKE = {  # row: (config class, model class, extra config kwargs)
    "llama": ("Llama", "LlamaForCausalLM", {}),
    "mistral": ("Mistral", "MistralForCausalLM", {}),
    "qwen2": ("Qwen2", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3", "Qwen3ForCausalLM", {"head_dim": 16}),
    "qwen3_moe": ("Qwen3Moe", "Qwen3MoeForCausalLM",
                  {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "gemma": ("Gemma", "GemmaForCausalLM", {"head_dim": 16}),
    "gemma2": ("Gemma2", "Gemma2ForCausalLM", {"head_dim": 16}),
    "gemma3_text": ("Gemma3Text", "Gemma3ForCausalLM", {"head_dim": 16}),
    "phi3": ("Phi3", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "granite": ("Granite", "GraniteForCausalLM", {}),
    "stablelm": ("StableLm", "StableLmForCausalLM", {}),
    "cohere": ("Cohere", "CohereForCausalLM", {}),
}  # fmt: skip


def build(row: str) -> torch.nn.Module:
    """A tiny random model of `row`'s family (width 64, 2 layers, 4 heads, vocab 97)."""
    torch.manual_seed(0)
    if row in _LLAMA_LIKE:
        cfg_name, model_name, extra = _LLAMA_LIKE[row]
        cfg = getattr(tf, f"{cfg_name}Config")(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               max_position_embeddings=64, **extra)  # fmt: skip
        return getattr(tf, model_name)(cfg)
    if row == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64))
    if row == "gptj":
        return tf.GPTJForCausalLM(tf.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                n_positions=64))  # fmt: skip
    if row == "opt":
        return tf.OPTForCausalLM(tf.OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                              num_attention_heads=4, word_embed_proj_dim=64,
                                              max_position_embeddings=64))  # fmt: skip
    if row == "gpt_neox":
        return tf.GPTNeoXForCausalLM(
            tf.GPTNeoXConfig(
                vocab_size=VOCAB,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                rotary_pct=0.25,
            )
        )
    if row in ("qwen2_vl", "qwen2_5_vl"):
        name = "Qwen2VL" if row == "qwen2_vl" else "Qwen2_5_VL"
        cfg = getattr(tf, f"{name}Config")(
            text_config=dict(vocab_size=VOCAB + 3, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}),
            vision_config=dict(depth=1, embed_dim=64, hidden_size=64, num_heads=4, patch_size=4, out_hidden_size=64),
            image_token_id=VOCAB + 2, video_token_id=VOCAB + 1, vision_start_token_id=VOCAB, bos_token_id=1,
            eos_token_id=2, pad_token_id=0,
        )  # fmt: skip
        return getattr(tf, f"{name}ForConditionalGeneration")(cfg)
    raise ValueError(f"no tiny builder for row {row!r}; rows: {ROWS}")


ROWS = [*_LLAMA_LIKE, "gpt2", "gptj", "opt", "gpt_neox", "qwen2_vl", "qwen2_5_vl"]


def cache_bytes(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int) -> tuple[int, torch.Tensor]:
    """(bytes of every key and value tensor in the cache `generate` returns, the generated ids)."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                             return_dict_in_generate=True, pad_token_id=0)  # fmt: skip
    cache = out.past_key_values
    total = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
                if t is not None)  # fmt: skip
    return total, out.sequences


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    rows = []
    for row in ROWS:
        base = build(row).eval()
        injected = mmpreproj.inject(copy.deepcopy(base))  # paper init
        assert injected.mmpreproj_state.host == row, (row, injected.mmpreproj_state.host)
        b, _ = cache_bytes(base, ids, args.new_tokens)
        i, _ = cache_bytes(injected, ids, args.new_tokens)
        rows.append({"row": row, "base_bytes": b, "injected_bytes": i, "ratio": i / b})
        print(f"  {row:12s} KV-cache bytes base {b:8d} | injected {i:8d} | ratio {i / b:.3f}", flush=True)
    result = {"machine": machine(), "new_tokens": args.new_tokens, "rows": rows}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
