"""A tiny Llama model written as a GGUF file with the `gguf` package's writer, laid out as llama.cpp's
converter writes SmolLM2 (the real file's keys: `general.architecture llama`, `llama.*` shape keys, a
byte-level BPE tokenizer `tokenizer.ggml.model gpt2`), so transformers' GGUF reader treats it as it treats
the 98 MB model. Tests never read the real one."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable unicode table (the alphabet of a byte-level BPE)."""
    bs = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]


def write_tiny_llama_gguf(
    path: str | Path,
    *,
    dim: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 64,
    seed: int = 0,
) -> Path:
    """Write a random tiny Llama (tied embeddings, F32 tensors) with a 270-token byte-level BPE to `path`."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = special + _byte_chars() + ["".join(m.split()) for m in MERGES]
    types = [gguf.TokenType.CONTROL] * len(special) + [gguf.TokenType.NORMAL] * (len(tokens) - len(special))
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(dim)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(dim // heads)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    head_dim = dim // heads
    writer.add_tensor("token_embd.weight", w(len(tokens), dim))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", 1 + w(dim))
        writer.add_tensor(f"blk.{i}.attn_q.weight", w(dim, dim))
        writer.add_tensor(f"blk.{i}.attn_k.weight", w(kv_heads * head_dim, dim))
        writer.add_tensor(f"blk.{i}.attn_v.weight", w(kv_heads * head_dim, dim))
        writer.add_tensor(f"blk.{i}.attn_output.weight", w(dim, dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + w(dim))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(ffn, dim))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(ffn, dim))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(dim, ffn))
    writer.add_tensor("output_norm.weight", 1 + w(dim))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
