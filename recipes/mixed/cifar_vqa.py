"""Text + image tokens through one decoder: does per-modality RoPE help, and how is the content skip used?

The method, top to bottom:
  1. load CIFAR-10 from the shipped assets (train split for training, test split for testing) and build a
     word tokenizer in code (`cifar_tasks.py`); questions: the class of an image, which row / column of a
     picture of 1-3 x 1-3 cells holds the object (needs the 2D layout), which of two images shows a class;
  2. build a LLaVA-style model from scratch: a position-free patch tower (per-patch MLP, so every spatial cue
     must come from the decoder's positions), a 2x2 merge + MLP projector, a causal `Block` decoder;
  3. train six arms at the same budget (steps, batch, data order, seed, base init):
       mrope+adapter     M-RoPE positions (text 1D, image 2D; Qwen2-VL's chunked frequency layout)
                         + one pre-projection and content skip per decoder block, shared by text and image tokens
       mrope-il+adapter  the same with Qwen3-VL's interleaved frequency layout (see mmpreproj.rope.layouts)
       1d+adapter        the same with plain 1D positions over image tokens (every token counts up)
       mrope, mrope-il, 1d   the three without the pre-projection / skip
     and, on request (`--arms`), two on a tiny transformers Qwen2-VL (`qwen2vl_arms.py`): its own M-RoPE with and
     without the pre-projection + skip in both towers;
  4. greedy-decode the answer of held-out questions (KV cache) and score exact match per question type;
  5. for the adapter arms, measure per-layer routing ratios ||W_skip x~|| / ||attn_out|| over text tokens and
     over image tokens (`mmpreproj.analysis.routing_ratios` with a token mask);
  6. write results.json, results.md (the table) and routing.png under --out.

    .venv/bin/python recipes/mixed/cifar_vqa.py --out runs/mixed-cifar          # default, ~15 min on 2 cores
    .venv/bin/python recipes/mixed/cifar_vqa.py --quick --out /tmp/mixed-quick  # ~30 s smoke run
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.*`
from cifar_tasks import (  # noqa: E402
    QUESTION_TYPES,
    Question,
    WordTokenizer,
    load_cifar,
    make_questions,
    next_token_loss,
    train_loop,
)  # fmt: skip
from qwen2vl_arms import QWEN2VL_ARMS, run_qwen2vl_arm  # noqa: E402

from mmpreproj import PreProjConfig  # noqa: E402
from mmpreproj.analysis import plot_skip_norms, routing_ratios, skip_norms  # noqa: E402
from mmpreproj.data.assets import asset_path  # noqa: E402
from recipes.kit.recipe import parse_config  # noqa: E402
from recipes.mixed.tinyvlm import (  # noqa: E402
    IMAGE,
    TEXT,
    MixedModel,
    NativeDecoder,
    PatchTower,
    VisionProjector,
    generate,
    inject_decoder,
)  # fmt: skip

ARMS = {  # name: (positions over image tokens, M-RoPE frequency layout, pre-projection + skip)
    "mrope+adapter": ("mrope", "chunked", True),
    "mrope-il+adapter": ("mrope", "interleaved", True),
    "1d+adapter": ("1d", "chunked", True),
    "mrope": ("mrope", "chunked", False),
    "mrope-il": ("mrope", "interleaved", False),
    "1d": ("1d", "chunked", False),
}


@dataclass
class MixedConfig:
    """Every knob of the run; the CLI is generated from these fields."""

    data: str = str(asset_path("cifar10"))  # a folder holding {train,test}.zip (members <split>/<class>/*.jpg)
    out: str = "runs/mixed-cifar"
    arms: str = ",".join(ARMS)
    seed: int = 0
    threads: int = 1  # torch threads; more than 1 thrashes on a shared, loaded machine
    train_per_class: int = 0  # 0 = every shipped image
    test_per_class: int = 0
    test_questions: int = 1000  # divided evenly over the question types
    # model
    patch: int = 4
    tower_width: int = 64
    tower_depth: int = 0  # 0: position-free per-patch MLP; >0: Blocks (with --tower-rope: 2D RoPE inside)
    tower_rope: bool = False
    merge: int = 2
    width: int = 64
    depth: int = 4
    heads: int = 2
    theta: float = 10000.0
    # optimisation
    steps: int = 1200
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    log_every: int = 50
    quick: bool = False  # a ~30 s smoke run: tiny data, model and step count

    def __post_init__(self) -> None:
        unknown = set(self.arms.split(",")) - set(ARMS) - set(QWEN2VL_ARMS)
        if unknown:
            raise ValueError(f"unknown arms {sorted(unknown)}; choose from {[*ARMS, *QWEN2VL_ARMS]}")
        if self.quick:
            self.train_per_class, self.test_per_class, self.test_questions = 20, 10, 64
            self.width, self.depth, self.heads, self.tower_width = 32, 2, 2, 32
            self.steps, self.batch_size, self.log_every = 25, 16, 5


def build_model(cfg: MixedConfig, tok: WordTokenizer, position_mode: str, layout: str, adapter: bool) -> MixedModel:
    torch.manual_seed(cfg.seed)  # every arm starts from the same base weights
    tower = PatchTower(cfg.patch, cfg.tower_width, cfg.tower_depth, num_heads=2, rope=cfg.tower_rope)
    projector = VisionProjector(cfg.tower_width, cfg.width, cfg.merge)
    decoder = NativeDecoder(len(tok), cfg.width, cfg.depth, cfg.heads, theta=cfg.theta, layout=layout)
    model = MixedModel(tower, projector, decoder, tok.markers, position_mode)
    if adapter:  # one pre-projection + content skip per decoder block, for text and image tokens alike
        inject_decoder(model, PreProjConfig(freeze_base=False))
    return model


def train(model: MixedModel, cfg: MixedConfig, images, labels, tok: WordTokenizer) -> list[dict]:
    """`train_loop` on our decoders: samples batched by `model.prepare`."""

    def loss_of(samples: list) -> torch.Tensor:
        batch = model.prepare(samples)
        logits, _ = model(**batch.decoder_inputs())  # (B, S, vocab)
        return next_token_loss(logits, batch.labels)

    return train_loop(model, cfg, images, labels, tok, loss_of)


def _chunks(questions: list[Question], size: int = 64) -> list[list[Question]]:
    return [questions[i : i + size] for i in range(0, len(questions), size)]


@torch.no_grad()
def evaluate(model: MixedModel, questions: list[Question]) -> dict[str, float]:
    """Exact-match accuracy of the greedy first answer token (KV-cache decoding), per question type and overall."""
    model.eval()
    hits: dict[str, list[bool]] = {k: [] for k in QUESTION_TYPES}
    for chunk in _chunks(questions):
        prompts = [dataclasses.replace(q.sample, target_ids=[]) for q in chunk]
        tokens = generate(model, model.prepare(prompts), max_new_tokens=1).tokens[:, 0]
        for q, t in zip(chunk, tokens.tolist()):
            hits[q.kind].append(t == q.answer)
    acc = {k: sum(v) / len(v) for k, v in hits.items() if v}
    acc["all"] = sum(sum(v) for v in hits.values()) / sum(len(v) for v in hits.values())
    return acc


@torch.no_grad()
def routing_by_modality(model: MixedModel, questions: list[Question]) -> dict[str, dict[int, float]]:
    """Per-layer ||W_skip x~|| / ||attn_out|| over text tokens and over image tokens of the prompts+answers."""
    model.eval()
    batches = [model.prepare([q.sample for q in chunk]) for chunk in _chunks(questions)]
    out = {}
    for name, code in (("text", TEXT), ("image", IMAGE)):
        feed = [{**b.decoder_inputs(), "mask": (b.modality == code) & b.attention_mask.bool()} for b in batches]
        out[name] = routing_ratios(model, feed, token_mask_key="mask")
    return out


def write_report(out: Path, report: dict) -> None:
    """results.md: accuracy per arm and question type, then routing ratios per layer (text | image); routing.png."""
    results, kinds = report["arms"], [*QUESTION_TYPES, "all"]
    lines = ["| arm | " + " | ".join(kinds) + " | final loss | params | train s (CPU s) |",
             "|---|" + "---|" * (len(kinds) + 3)]  # fmt: skip
    for arm, r in results.items():
        accs = " | ".join(f"{100 * r['accuracy'][k]:.1f}" for k in kinds)
        lines.append(f"| {arm} | {accs} | {r['loss'][-1]['loss']:.3f} | {r['params']:,} | "
                     f"{r['train_s']:.0f} ({r['train_cpu_s']:.0f}) |")  # fmt: skip
    routed = {a: r for a, r in results.items() if "routing" in r}
    if routed:
        depth = len(next(iter(routed.values()))["routing"]["text"])
        lines += ["", "Routing ratio ||W_skip x~|| / ||attn_out|| per decoder layer (text | image tokens):", "",
                  "| arm | " + " | ".join(f"L{i} text | L{i} image" for i in range(depth)) + " |",
                  "|---|" + "---|---|" * depth]  # fmt: skip
        for arm, r in routed.items():
            cells = [f"{r['routing']['text'][i]:.3f} | {r['routing']['image'][i]:.3f}" for i in range(depth)]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        series = {f"{a} {m}": list(r["routing"][m].values()) for a, r in routed.items() for m in ("text", "image")}
        plot_skip_norms(series, out / "routing.png", title="content-skip routing by modality",
                        ylabel="||W_skip x~|| / ||attn_out||")  # fmt: skip
    load = " / ".join(f"{x:.2f}" for x in report["loadavg_start"])
    lines += ["", f"Accuracy in % on {report['config']['test_questions']} held-out questions (test-split images). "
              f"Wall {report['wall_s']:.0f} s, process CPU {report['cpu_s']:.0f} s, "
              f"{report['config']['threads']} thread(s); 1/5/15-min load average at start {load}."]  # fmt: skip
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


_HELP = {
    "arms": f"comma-separated arms, default the six on our decoders ({','.join(ARMS)}); "
    f"the transformers Qwen2-VL arms are {','.join(QWEN2VL_ARMS)}",
}


def main(argv: list[str] | None = None) -> dict:
    cfg = parse_config(MixedConfig, argv, __doc__, help=_HELP)
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    load = os.getloadavg()

    tok = WordTokenizer()
    train_x, train_y = load_cifar(cfg.data, "train", cfg.train_per_class or None)
    test_x, test_y = load_cifar(cfg.data, "test", cfg.test_per_class or None)
    test = make_questions(cfg.test_questions, test_x, test_y, tok, seed=cfg.seed + 12345)
    print(f"{len(train_x)} train / {len(test_x)} test images from {cfg.data}; {len(test)} test questions")

    results = {}
    for arm in cfg.arms.split(","):
        if arm in QWEN2VL_ARMS:  # transformers Qwen2-VL, same data, budget and seed (qwen2vl_arms.py)
            print(f"arm {arm}: Qwen2-VL M-RoPE, pre-projection + skip {QWEN2VL_ARMS[arm]}", flush=True)
            results[arm] = run_qwen2vl_arm(arm, cfg, tok, train_x, train_y, test)
            print(f"  accuracy {results[arm]['accuracy']}", flush=True)
            continue
        mode, layout, adapter = ARMS[arm]
        print(f"arm {arm}: positions {mode} ({layout}), pre-projection + skip {adapter}", flush=True)
        model = build_model(cfg, tok, mode, layout, adapter)
        t0, cpu0 = time.time(), time.process_time()
        log = train(model, cfg, train_x, train_y, tok)
        r = {"positions": mode, "layout": layout, "adapter": adapter, "loss": log, "train_s": time.time() - t0,
             "train_cpu_s": time.process_time() - cpu0,
             "params": sum(p.numel() for p in model.parameters()),
             "accuracy": evaluate(model, test)}  # fmt: skip
        if adapter:
            r["routing"] = routing_by_modality(model, test[: min(len(test), 192)])
            r["skip_norms"] = skip_norms(model)
        print(f"  accuracy {r['accuracy']}", flush=True)
        results[arm] = r
    wall = time.time() - start
    report = {"config": dataclasses.asdict(cfg), "wall_s": wall, "cpu_s": time.process_time(), "loadavg_start": load,
              "loadavg_end": os.getloadavg(), "arms": results}  # fmt: skip
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    write_report(out, report)
    return report


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
