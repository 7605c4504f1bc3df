"""Pretrain a mini Pythia (GPT-NeoX, 4 layers, d=256) on Project Gutenberg books, on CPU.

The method, top to bottom:
  1. read each book and keep the text between its ``*** START OF`` and ``*** END OF`` lines,
     unwrap hard-wrapped paragraphs;
  2. train a byte-level BPE tokenizer on the books (Pythia-style: no prefix space, ``<|endoftext|>`` = 0);
  3. tokenize, join the books with ``<|endoftext|>``, cut into 256-token blocks, hold out 1% of the blocks;
  4. train a Pythia-architecture GPT-NeoX from scratch with AdamW, cosine schedule with warmup, fp32 on CPU;
  5. log train loss, val loss and tokens/s;
  6. save the model in fp16 safetensors with its tokenizer, reload it, check it, write TRAINING.md.

Example (the committed ``assets/mini-pythia`` checkpoint; see its TRAINING.md for the exact command):
    .venv/bin/python recipes/text/pretrain_mini.py --books /work/shared/data/gutenberg --out assets/mini-pythia
"""

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time
import typing
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import AutoTokenizer, GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parents[2]
EOS = "<|endoftext|>"
PROMPT = "It was a dark and stormy night"
TOK_CLASS = "PreTrainedTokenizerFast"


@dataclass
class PretrainConfig:
    """Every knob of the run; the CLI is generated from these fields."""

    books: str = str(REPO / "assets" / "books")  # folder of Project Gutenberg .txt files
    out: str = str(REPO / "runs" / "mini-pythia")  # output folder (written atomically)
    seed: int = 0
    threads: int = 2  # torch.set_num_threads
    # tokenizer
    vocab_size: int = 8192
    min_frequency: int = 2
    # model (Pythia architecture, scaled down)
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    max_position_embeddings: int = 512
    rotary_pct: float = 0.25
    rotary_emb_base: int = 10000
    # data
    block_size: int = 256
    val_frac: float = 0.01
    # optimisation
    steps: int = 500
    batch_size: int = 8
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    # logging and evaluation
    eval_every: int = 100
    eval_batches: int = 8  # val batches for the periodic evals; the final eval uses all val blocks
    log_every: int = 10
    probe_seconds: float = 0.0  # > 0: train this long, print tokens/s, save nothing
    wikitext_valid: str = ""  # optional wiki.valid.raw for a line-level perplexity in TRAINING.md
    wikitext_rows: int = 300

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if not 0.0 < self.val_frac < 1.0:
            raise ValueError(f"val_frac must be in (0, 1), got {self.val_frac}")
        if self.block_size > self.max_position_embeddings:
            raise ValueError("block_size must not exceed max_position_embeddings")
        if self.steps < 1 or self.warmup_steps >= self.steps:
            raise ValueError(f"need 0 <= warmup_steps < steps, got {self.warmup_steps} / {self.steps}")


def parse_args(argv: list[str] | None = None) -> PretrainConfig:
    """Build an argparse CLI from the fields of PretrainConfig (``--field-name``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(PretrainConfig)
    for f in dataclasses.fields(PretrainConfig):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=hints[f.name],
            default=f.default,
            help=f"(default: {f.default})",
        )
    return PretrainConfig(**vars(parser.parse_args(argv)))


# ---------------------------------------------------------------------------------------------------------
# 1. Books
# ---------------------------------------------------------------------------------------------------------
def book_files(folder: str) -> list[Path]:
    """The .txt files of a folder, sorted by name."""
    files = sorted(Path(folder).glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no .txt books in {folder}")
    return files


def clean_book(raw: str) -> str:
    """Keep the text between the PG START and END lines; unwrap paragraphs; drop illustration tags.

    One file (Wuthering Heights, PG 768) writes ``***START OF`` without the space, hence `` ?``.
    """
    lines = raw.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\*\*\* ?START OF", line))
    end = next(i for i, line in enumerate(lines) if re.match(r"\*\*\* ?END OF", line))
    body = "\n".join(lines[start + 1 : end])
    body = re.sub(r"\[Illustration.*?\]", "", body, flags=re.DOTALL)
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", body))  # unwrap, single spaces
    return "\n\n".join(p for p in paragraphs if p)


def read_books(folder: str) -> tuple[list[Path], list[str]]:
    """Read every book (utf-8-sig drops the BOM) and clean it."""
    files = book_files(folder)
    return files, [clean_book(f.read_text(encoding="utf-8-sig")) for f in files]


# ---------------------------------------------------------------------------------------------------------
# 2. Tokenizer
# ---------------------------------------------------------------------------------------------------------
def train_tokenizer(texts: list[str], cfg: PretrainConfig) -> Tokenizer:
    """Byte-level BPE as in Pythia: NFC, ByteLevel(add_prefix_space=False), ``<|endoftext|>`` has id 0."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    assert tok.token_to_id(EOS) == 0, "<|endoftext|> must be id 0"
    return tok


def wrap_tokenizer(tok: Tokenizer, cfg: PretrainConfig) -> PreTrainedTokenizerFast:
    """The HF wrapper that ``AutoTokenizer.from_pretrained`` reloads; eos doubles as bos, unk and pad."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
        model_max_length=cfg.max_position_embeddings,
    )


# ---------------------------------------------------------------------------------------------------------
# 3. Blocks
# ---------------------------------------------------------------------------------------------------------
def make_blocks(tok: Tokenizer, texts: list[str], cfg: PretrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize, join books with eos, cut into blocks (the tail is dropped); split train / val at random."""
    eos_id = tok.token_to_id(EOS)
    stream: list[int] = []
    for enc in tok.encode_batch(texts):
        stream.extend(enc.ids)
        stream.append(eos_id)
    n_blocks = len(stream) // cfg.block_size
    blocks = torch.tensor(stream[: n_blocks * cfg.block_size], dtype=torch.long).view(n_blocks, cfg.block_size)
    perm = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(cfg.seed))
    n_val = max(1, round(cfg.val_frac * n_blocks))
    return blocks[perm[n_val:]], blocks[perm[:n_val]]


# ---------------------------------------------------------------------------------------------------------
# 4. Model and optimiser
# ---------------------------------------------------------------------------------------------------------
def build_model(cfg: PretrainConfig) -> GPTNeoXForCausalLM:
    """A freshly initialised GPT-NeoX with Pythia's architecture choices."""
    config = GPTNeoXConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rotary_pct=cfg.rotary_pct,
        rotary_emb_base=cfg.rotary_emb_base,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        layer_norm_eps=1e-5,
        hidden_act="gelu",
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return GPTNeoXForCausalLM(config)


def make_optimizer(model: torch.nn.Module, cfg: PretrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on biases, LayerNorms)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def lr_at(step: int, cfg: PretrainConfig) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``lr * min_lr_ratio`` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - 1 - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def eval_loss(model: GPTNeoXForCausalLM, blocks: torch.Tensor, batch_size: int) -> float:
    """Mean next-token loss over ``blocks`` (every block has the same length, so the mean of means is exact)."""
    model.eval()
    losses = [model(input_ids=b, labels=b).loss.item() * len(b) for b in blocks.split(batch_size)]
    model.train()
    return sum(losses) / len(blocks)


# ---------------------------------------------------------------------------------------------------------
# 5. Training loop
# ---------------------------------------------------------------------------------------------------------
def train(
    model: GPTNeoXForCausalLM, train_blocks: torch.Tensor, val_blocks: torch.Tensor, cfg: PretrainConfig
) -> dict:
    """Train for ``cfg.steps`` steps (or ``cfg.probe_seconds``); return the log and figures."""
    opt = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(train_blocks), generator=gen)
    cursor, epochs = 0, 0
    tokens_per_step = cfg.batch_size * cfg.block_size
    evals: list[tuple[int, float]] = []
    recent: list[float] = []
    model.train()
    t0 = time.perf_counter()
    eval_time = 0.0
    pbar = tqdm(range(cfg.steps), desc="train", mininterval=5.0, file=sys.stdout)
    step = 0
    for step in pbar:
        if cursor + cfg.batch_size > len(order):  # next epoch, new shuffle
            order, cursor, epochs = torch.randperm(len(train_blocks), generator=gen), 0, epochs + 1
        batch = train_blocks[order[cursor : cursor + cfg.batch_size]]
        cursor += cfg.batch_size
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recent = (recent + [loss.item()])[-50:]
        train_time = time.perf_counter() - t0 - eval_time
        tok_s = (step + 1) * tokens_per_step / train_time
        if (step + 1) % cfg.log_every == 0:
            pbar.set_postfix(
                loss=f"{sum(recent) / len(recent):.3f}", lr=f"{lr_at(step, cfg):.2e}", tok_s=f"{tok_s:.0f}"
            )
        if cfg.probe_seconds and train_time >= cfg.probe_seconds:
            break
        if (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            te = time.perf_counter()
            val = eval_loss(model, val_blocks[: cfg.eval_batches * cfg.batch_size], cfg.batch_size)
            eval_time += time.perf_counter() - te
            evals.append((step + 1, val))
            tqdm.write(f"step {step + 1}: train {sum(recent) / len(recent):.4f}  val {val:.4f}  tok/s {tok_s:.0f}")
    pbar.close()
    train_time = time.perf_counter() - t0 - eval_time
    steps_done = step + 1
    return {
        "steps": steps_done,
        "tokens": steps_done * tokens_per_step,
        "epochs": epochs + cursor / len(order),
        "train_seconds": train_time,
        "tokens_per_s": steps_done * tokens_per_step / train_time,
        "final_train_loss": sum(recent) / len(recent),
        "evals": evals,
    }


# ---------------------------------------------------------------------------------------------------------
# 6. Save, reload, check, document
# ---------------------------------------------------------------------------------------------------------
@torch.no_grad()
def wikitext_line_ppl(
    model: GPTNeoXForCausalLM, tok: PreTrainedTokenizerFast, path: str, rows: int
) -> tuple[float, int]:
    """Line-level perplexity on the first ``rows`` rows: each row alone (>= 50 chars, >= 10 tokens), <= 512 tokens."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()[:rows]
    losses = []
    for line in lines:
        text = line.strip()
        ids = tok(text, truncation=True, max_length=512, return_tensors="pt").input_ids
        if len(text) < 50 or ids.shape[1] < 10:
            continue
        losses.append(model(input_ids=ids, labels=ids).loss.item())
    return math.exp(sum(losses) / len(losses)), len(losses)


@torch.no_grad()
def check_saved(folder: Path, val_blocks: torch.Tensor, cfg: PretrainConfig) -> dict:
    """Reload the saved folder as a user would (fp32), recompute val loss, generate, optional WikiText ppl."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = GPTNeoXForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    val = eval_loss(model, val_blocks, cfg.batch_size)
    enc = tok(PROMPT, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=30, do_sample=False, pad_token_id=tok.pad_token_id)
    checks = {"val_loss": val, "sample": tok.decode(out[0], skip_special_tokens=False)}
    if cfg.wikitext_valid:
        checks["wikitext_ppl"], checks["wikitext_rows"] = wikitext_line_ppl(
            model, tok, cfg.wikitext_valid, cfg.wikitext_rows
        )
    return checks


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shown(path: str | Path) -> str:
    """A path relative to the repository when it lies inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def training_md(cfg: PretrainConfig, files: list[Path], data: dict, log: dict, checks: dict, wall: float) -> str:
    """The TRAINING.md that ships with the checkpoint."""
    argv = [shown(sys.argv[0])] + [shown(a) if os.path.exists(a) else a for a in sys.argv[1:]]
    rows = "\n".join(f"| {f.name} | {f.stat().st_size:,} | `{sha256(f)}` |" for f in files)
    evals = "\n".join(f"| {s} | {v:.4f} | {math.exp(v):.2f} |" for s, v in log["evals"])
    wiki = (
        f"- WikiText-2 raw validation (`{shown(cfg.wikitext_valid)}`), first {cfg.wikitext_rows} rows, each row alone "
        f"(rows with >= 50 stripped characters and >= 10 tokens: {checks['wikitext_rows']}), truncated to 512 tokens, "
        f"PPL = exp(mean of per-row mean loss): **{checks['wikitext_ppl']:.1f}** (a books model, out of domain)\n"
        if "wikitext_ppl" in checks
        else ""
    )
    conf = json.dumps(
        {k: shown(v) if k in ("books", "out") else v for k, v in dataclasses.asdict(cfg).items()}, indent=2
    )
    return f"""# mini-pythia: training record

A 4-layer, d=256 GPT-NeoX with Pythia's architecture (parallel residual, 25% rotary, base 10000, untied
embeddings, GELU, LayerNorm eps 1e-5), trained from scratch on public-domain Project Gutenberg books, with a
byte-level BPE tokenizer ({cfg.vocab_size} tokens, `<|endoftext|>` = 0 = eos = bos = pad = unk) trained on
the same books. Weights in fp16 safetensors. Written by `recipes/text/pretrain_mini.py`.

## Command

```
{shlex.join([".venv/bin/python"] + argv)}
```

Seed {cfg.seed}; `torch.set_num_threads({cfg.threads})`; fp32 training on CPU.
Machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared with other jobs), {platform.system()};
Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__},
tokenizers {tokenizers.__version__}.

## Data

{len(files)} books from `{shown(cfg.books)}` (each read with `utf-8-sig`, cut to the text between its
`*** START OF` and `*** END OF` lines, paragraphs unwrapped with runs of whitespace made single spaces, \
`[Illustration]` tags dropped), joined with
`<|endoftext|>` and cut into {cfg.block_size}-token blocks: {data["tokens"]:,} tokens, {data["train_blocks"]:,}
train blocks, {data["val_blocks"]:,} validation blocks ({cfg.val_frac:.0%}, chosen at random with the seed).

| file | bytes | sha256 |
|---|---|---|
{rows}

## Training

- {log["steps"]:,} steps x {cfg.batch_size} x {cfg.block_size} tokens = {log["tokens"]:,} tokens \
({log["epochs"]:.2f} epochs)
- AdamW lr {cfg.lr:g} (betas {cfg.beta1}, {cfg.beta2}), {cfg.warmup_steps} warmup steps then cosine to
  {cfg.lr * cfg.min_lr_ratio:g}, weight decay {cfg.weight_decay} (matrices only), grad clip {cfg.grad_clip}
- training wall time {log["train_seconds"]:.0f} s ({log["tokens_per_s"]:.0f} tokens/s); whole script {wall:.0f} s
- final train loss (mean of the last 50 steps): {log["final_train_loss"]:.4f}

| step | val loss ({cfg.eval_batches * cfg.batch_size} blocks) | val ppl |
|---|---|---|
{evals}

## Checks on the saved folder (reloaded with AutoTokenizer / GPTNeoXForCausalLM, fp32)

- validation loss on all {data["val_blocks"]:,} held-out blocks: **{checks["val_loss"]:.4f}**,
  perplexity **{math.exp(checks["val_loss"]):.2f}**
{wiki}- greedy, 30 new tokens from "{PROMPT}":

```
{checks["sample"]}
```

## Config

```json
{conf}
```
"""


def save_atomic(model: GPTNeoXForCausalLM, hf_tok: PreTrainedTokenizerFast, cfg: PretrainConfig, write_md) -> None:
    """Save into a temporary sibling folder, check it, write TRAINING.md, then rename it to ``cfg.out``."""
    out = Path(cfg.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.half().save_pretrained(tmp, safe_serialization=True)
        hf_tok.save_pretrained(tmp)
        tok_config = tmp / "tokenizer_config.json"  # name the class transformers 4.x also knows
        tok_config.write_text(
            json.dumps({**json.loads(tok_config.read_text()), "tokenizer_class": TOK_CLASS}, indent=2)
        )
        (tmp / "TRAINING.md").write_text(write_md(tmp), encoding="utf-8")
        for path in [tmp, *tmp.iterdir()]:  # mkdtemp makes the folder private
            path.chmod(0o755 if path.is_dir() else 0o644)
        old = out.with_name(f".{out.name}-old") if out.exists() else None
        if old:
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
        tmp.rename(out)
        if old:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> None:
    """Run the six steps."""
    cfg = parse_args(argv)
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)

    files, texts = read_books(cfg.books)  # 1
    print(f"[1] {len(files)} books, {sum(map(len, texts)):,} characters after cleaning")
    tok = train_tokenizer(texts, cfg)  # 2
    print(f"[2] BPE tokenizer, {tok.get_vocab_size()} tokens ({time.perf_counter() - t_start:.0f} s)")
    train_blocks, val_blocks = make_blocks(tok, texts, cfg)  # 3
    n_tokens = (len(train_blocks) + len(val_blocks)) * cfg.block_size
    print(f"[3] {n_tokens:,} tokens: {len(train_blocks):,} train / {len(val_blocks):,} val blocks")
    model = build_model(cfg)  # 4
    print(f"[4] GPT-NeoX, {sum(p.numel() for p in model.parameters()):,} parameters")
    log = train(model, train_blocks, val_blocks, cfg)  # 5
    print(f"[5] {log['steps']} steps, {log['tokens']:,} tokens, {log['tokens_per_s']:.0f} tokens/s")
    if cfg.probe_seconds:
        print(
            f"probe: {log['tokens_per_s']:.0f} tokens/s, "
            f"{log['tokens_per_s'] / (cfg.batch_size * cfg.block_size):.3f} steps/s"
        )
        return
    data = {"tokens": n_tokens, "train_blocks": len(train_blocks), "val_blocks": len(val_blocks)}

    def write_md(folder: Path) -> str:
        checks = check_saved(folder, val_blocks, cfg)
        print(f"[6] reloaded: val loss {checks['val_loss']:.4f}; sample: {checks['sample']!r}")
        return training_md(cfg, files, data, log, checks, time.perf_counter() - t_start)

    save_atomic(model, wrap_tokenizer(tok, cfg), cfg, write_md)  # 6
    print(f"[6] saved {cfg.out}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
