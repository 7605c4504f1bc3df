"""The paper's evaluators, each against the computation written out by hand on a few real examples."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mmpreproj.data import hellaswag_examples, lambada_examples, pythia_tokenizer, wikitext_lines
from mmpreproj.eval import (
    arc_easy_accuracy,
    choice_requests,
    evaluate,
    hellaswag_accuracy,
    lambada_accuracy,
    line_perplexity,
    score_continuations,
)
from tests.helpers.eval_models import ForcedNext, tiny_pythia


def token_logprobs(model: nn.Module, ids: list[int]) -> list[tuple[float, int]]:
    """(log p(ids[i] | ids[:i]), argmax at i-1) for i = 1..len-1, from one forward over the single sequence."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]  # (S, V)
    out = []
    for i in range(1, len(ids)):
        lp = torch.log_softmax(logits[i - 1].double(), dim=-1)
        out.append((float(lp[ids[i]]), int(lp.argmax())))
    return out


@pytest.fixture(scope="module")
def tok():
    return pythia_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_pythia()


@pytest.mark.parametrize("batch_size", [1, 3])
def test_line_ppl_by_hand(model, tok, batch_size):
    long_rows = [r for r in wikitext_lines("validation")[:12] if len(r.strip()) >= 50][:2]
    short_row = " The European lobster is a species of clawed lobster from the Atlantic . \n"  # < 24 tokens
    scored = [*long_rows, short_row]
    rows = [*scored, " = Homarus gammarus = \n", "=" * 64 + "\n", ""]  # short, < 10 tokens, empty
    got = line_perplexity(model, tok, rows, max_length=24, batch_size=batch_size, progress=False)
    row_losses, n_tokens = [], []
    for row in scored:
        ids = tok(row)["input_ids"][:24]
        lps = token_logprobs(model, ids)
        row_losses.append(-sum(lp for lp, _ in lps) / len(lps))
        n_tokens.append(len(lps))
    assert n_tokens[:2] == [23, 23] and 10 <= n_tokens[2] < 23  # truncated, truncated, whole
    assert got["rows"] == 3 and got["skipped"] == 3 and got["tokens"] == sum(n_tokens)
    assert got["mean_loss"] == pytest.approx(sum(row_losses) / 3, abs=1e-5)
    assert got["ppl"] == pytest.approx(math.exp(sum(row_losses) / 3), rel=1e-5)


@pytest.fixture(scope="module")
def lambada_case(tok):
    """Three real examples with multi-token targets plus one over-long one; forcing makes the first right
    and the second right only at its first target token."""
    multi = [ex for ex in lambada_examples(40) if len(tok(ex["target"], add_special_tokens=False)["input_ids"]) > 1]
    a, b, c = multi[:3]
    forced = {}
    for ex, how in ((a, "all"), (b, "first")):
        ctx = tok(ex["context"])["input_ids"]
        tgt = tok(ex["target"], add_special_tokens=False)["input_ids"]
        forced[tuple(ctx)] = tgt[0]
        if how == "all":
            for k in range(1, len(tgt)):
                forced[tuple(ctx + tgt[:k])] = tgt[k]
        else:  # the second target token is forced to something else, so it cannot be the argmax
            forced[tuple(ctx + tgt[:1])] = (tgt[1] + 1) % 50000
    too_long = {"text": "x", "context": "word " * 600, "target": " end"}
    return [a, b, c, too_long], forced


@pytest.mark.parametrize("batch_size", [1, 4])
def test_lambada_by_hand(model, tok, lambada_case, batch_size):
    examples, forced = lambada_case
    forced_model = ForcedNext(model, forced)
    got = lambada_accuracy(forced_model, tok, examples, batch_size=batch_size, progress=False)
    verdicts, target_ll = [], []
    for ex in examples[:3]:
        ctx = tok(ex["context"])["input_ids"]
        tgt = tok(ex["target"], add_special_tokens=False)["input_ids"]
        steps = token_logprobs(forced_model, ctx + tgt)[len(ctx) - 1 :]  # one per target token
        verdicts.append([argmax == t for (_, argmax), t in zip(steps, tgt)])
        target_ll.append(sum(lp for lp, _ in steps))
    assert verdicts[0] == [True] * len(verdicts[0])
    assert verdicts[1][0] is True and not all(verdicts[1])  # right first token, wrong word
    expected = sum(all(v) for v in verdicts)
    assert expected == 1
    ppl = got.pop("ppl")
    assert got == {"acc": expected / 3, "correct": expected, "total": 3, "skipped": 1}
    assert abs(ppl - math.exp(-sum(target_ll) / 3)) < 1e-4 * ppl  # lm-eval's lambada perplexity


def test_lambada_without_forcing_scores_zero(model, tok, lambada_case):
    examples, _ = lambada_case
    assert lambada_accuracy(model, tok, examples[:3], progress=False)["correct"] == 0


@pytest.mark.parametrize("batch_size", [1, 5])
def test_hellaswag_by_hand(model, tok, batch_size):
    examples = [dict(ex) for ex in hellaswag_examples(3)]
    preds = []
    for ex in examples:
        scores = []
        for ending in ex["endings"]:
            full = tok(ex["ctx"] + " " + ending)["input_ids"]
            n_ctx = len(tok(ex["ctx"])["input_ids"])
            lps = token_logprobs(model, full)[n_ctx - 1 :]
            scores.append(sum(lp for lp, _ in lps) / len(lps))
            ctx_ids, cont_ids = choice_requests(tok, ex["ctx"], ending)
            primitive = score_continuations(model, [(ctx_ids, cont_ids)])[0]
            assert primitive.logprob / primitive.n_tokens == pytest.approx(scores[-1], abs=1e-5)
        preds.append(max(range(4), key=scores.__getitem__))
    examples[0]["label"], examples[1]["label"] = preds[0], preds[1]
    examples[2]["label"] = (preds[2] + 1) % 4
    got = hellaswag_accuracy(model, tok, examples, batch_size=batch_size, progress=False)
    assert got == {"acc": 2 / 3, "correct": 2, "total": 3}


def test_arc_easy_by_hand(model, tok):
    examples = [
        {
            "question": "Which gas do plants take in?",
            "choices": ["oxygen", "carbon dioxide", "helium"],
            "label": 1,
        },
        {"question": "What melts ice fastest?", "choices": ["salt", "sand", "sawdust", "stones"], "label": 0},
        {"question": "A question with a missing key?", "choices": ["a", "b"], "label": None},
    ]
    preds = []
    for ex in examples[:2]:
        scores = []
        for choice in ex["choices"]:
            full = tok(ex["question"] + " " + choice)["input_ids"]
            n_q = len(tok(ex["question"])["input_ids"])
            lps = token_logprobs(model, full)[n_q - 1 :]
            scores.append(sum(lp for lp, _ in lps) / len(lps))
        preds.append(max(range(len(scores)), key=scores.__getitem__))
    got = arc_easy_accuracy(model, tok, examples, progress=False)
    correct = sum(p == ex["label"] for p, ex in zip(preds, examples))
    assert got == {"acc": correct / 2, "correct": correct, "total": 2, "skipped": 1}


def test_evaluate_dispatches_to_the_paper_evaluators(model, tok):
    out = evaluate(model, tok, ["lambada", "hellaswag", "ppl"], limit=4, batch_size=4, progress=False)
    assert list(out) == ["lambada", "hellaswag", "ppl"]
    assert out["lambada"] == lambada_accuracy(model, tok, lambada_examples(4), progress=False)
    assert out["hellaswag"] == hellaswag_accuracy(model, tok, hellaswag_examples(4), progress=False)
    direct = line_perplexity(model, tok, wikitext_lines("validation")[:4], progress=False)
    assert out["ppl"] == pytest.approx(direct, rel=1e-6)
    assert out["ppl"]["rows"] == 1  # of the first 4 rows only one is long enough


def test_evaluate_marks_arc_easy_unavailable_offline(model, tok):
    out = evaluate(model, tok, ["arc_easy"], progress=False)
    msg = out["arc_easy"]["unavailable"]
    assert "allenai/ai2_arc" in msg and "\n" not in msg
    with pytest.raises(RuntimeError, match="not shipped"):
        evaluate(model, tok, ["arc_easy"], skip_unavailable=False, progress=False)


@pytest.mark.parametrize(
    ("kwargs", "allowed"),
    [
        ({"tasks": ["mmlu"]}, "ppl, lambada, hellaswag, arc_easy, doc_ppl"),
        ({"protocol": "harness"}, "paper, lm-eval"),
        ({"data_source": "s3"}, "local, hub"),
    ],
)
def test_evaluate_rejects_unknown_names(model, tok, kwargs, allowed):
    with pytest.raises(ValueError, match=allowed):
        evaluate(model, tok, **kwargs)
