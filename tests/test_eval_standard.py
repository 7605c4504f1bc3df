"""The standard protocol: rolling-window document PPL, and agreement with lm-evaluation-harness itself."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tomllib
import torch

from mmpreproj.data import pythia_tokenizer, wikitext_articles, wikitext_detokenize
from mmpreproj.eval import (
    LmEvalUnavailableError,
    document_perplexity,
    evaluate,
    make_hflm,
    rolling_windows,
    run_lm_eval,
    score_continuations,
)
from mmpreproj.eval.lm_eval_bridge import LM_EVAL_FLOOR, check_lm_eval_version
from tests.helpers.eval_models import ForcedNext, tiny_pythia
from tests.helpers.net_guard import refuse_network

lm_eval = pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def tok():
    return pythia_tokenizer()


@pytest.fixture(scope="module")
def model():
    return tiny_pythia()


@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 17, 30])
def test_default_windows_equal_lm_eval(n):
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    tokens = list(range(100, 100 + n))
    theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 0, 8, 1)]
    assert rolling_windows(tokens, max_length=8, prefix_token=0) == [(list(a), list(b)) for a, b in theirs]


@pytest.mark.parametrize("stride", [1, 3, 8])
def test_windows_score_each_token_once_within_max_length(stride):
    tokens = list(range(100, 123))
    windows = rolling_windows(tokens, max_length=8, prefix_token=0, stride=stride)
    assert [t for _, cont in windows for t in cont] == tokens
    seq = [0, *tokens]
    pos = 1
    for ctx, cont in windows:
        assert len(ctx) + len(cont) - 1 <= 8 and len(ctx) >= 1
        assert seq[pos - len(ctx) : pos] == ctx  # the context is what directly precedes the new tokens
        pos += len(cont)
    if stride < 8:
        assert all(len(ctx) + len(cont) - 1 == 8 for ctx, cont in windows[1:])  # full context after the first
    with pytest.raises(ValueError, match="stride"):
        rolling_windows(tokens, 8, 0, stride=9)


def test_document_ppl_by_hand_single_window(model, tok):
    docs = [
        "The quick brown fox jumps over the lazy dog .\n",
        " = Title = \n The river @-@ side town , 1 @,@ 000 .\n",
    ]
    got = document_perplexity(model, tok, docs, max_length=64, detokenize=wikitext_detokenize, progress=False)
    total_ll, total_tokens = 0.0, 0
    for doc in docs:
        ids = [0] + tok(wikitext_detokenize(doc), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0]
        for i in range(1, len(ids)):
            total_ll += float(torch.log_softmax(logits[i - 1].double(), -1)[ids[i]])
        total_tokens += len(ids) - 1
    words = (10 + 1) + (1 + 13 + 1)  # lm-eval's re.split(r"\s+"): an empty piece per leading/trailing space
    n_bytes = sum(len(d.encode()) for d in docs)
    assert got["tokens"] == total_tokens and got["words"] == words and got["bytes"] == n_bytes
    assert got["loglikelihood"] == pytest.approx(total_ll, abs=1e-4)
    assert got["token_perplexity"] == pytest.approx(math.exp(-total_ll / total_tokens), rel=1e-5)
    assert got["word_perplexity"] == pytest.approx(math.exp(-total_ll / words), rel=1e-5)
    assert got["byte_perplexity"] == pytest.approx(math.exp(-total_ll / n_bytes), rel=1e-5)
    assert got["bits_per_byte"] == pytest.approx(-total_ll / n_bytes / math.log(2), rel=1e-5)


def _instances(pairs, request_type="loglikelihood"):
    from lm_eval.api.instance import Instance

    return [Instance(request_type, {}, args, i) for i, args in enumerate(pairs)]


def test_lm_eval_loglikelihood_agrees_with_primitive(model, tok):
    pairs = [
        ("The cat sat on the", " mat"),
        ("In 1998, the river", " flooded the lower town twice"),
        ("A", " Pythia model"),
        ("She looked at the old photograph and", " smiled"),
        ("She looked at the old photograph and", " cried quietly"),
    ]
    ids = [(tok(c)["input_ids"], tok(x, add_special_tokens=False)["input_ids"]) for c, x in pairs]
    ctx, cont = ids[1]
    forced = {tuple(ctx + cont[:k]): cont[k] for k in range(len(cont))}  # request 1 becomes greedy
    forced[tuple(ids[2][0])] = ids[2][1][0]  # request 2: first token only, so not greedy
    wrapped = ForcedNext(model, forced)
    lm = make_hflm(wrapped, tok, batch_size=3)
    for (c, x), (c_ids, x_ids) in zip(pairs, ids):
        assert lm._encode_pair(c, x) == (c_ids, x_ids)  # same tokens on both sides
    theirs = lm.loglikelihood(_instances(pairs), disable_tqdm=True)
    ours = score_continuations(wrapped, ids, batch_size=2)
    assert [g for _, g in theirs] == [s.greedy for s in ours] == [False, True, False, False, False]
    assert [lp for lp, _ in theirs] == pytest.approx([s.logprob for s in ours], abs=1e-5)


def test_lm_eval_rolling_agrees_with_document_ppl(model, tok):
    docs = [wikitext_detokenize(a) for a in wikitext_articles("test")[28:30]]  # two short "articles"
    lm = make_hflm(model, tok, batch_size=4, max_length=16)
    theirs = lm.loglikelihood_rolling(_instances([(d,) for d in docs], "loglikelihood_rolling"), disable_tqdm=True)
    ours = document_perplexity(model, tok, docs, max_length=16, progress=False)
    assert ours["tokens"] > 2 * 16  # several windows per document
    assert ours["loglikelihood"] == pytest.approx(sum(theirs), abs=1e-4)


def test_run_lm_eval_local_wikitext_equals_document_ppl(model, tok):
    article = wikitext_articles("test")[0]
    out = run_lm_eval(model, tok, ["wikitext"], limit=1, max_length=128, batch_size=8, data_source="local")
    ours = document_perplexity(
        model, tok, [article], max_length=128, detokenize=wikitext_detokenize, batch_size=8, progress=False
    )
    assert out["wikitext"]["word_perplexity"] == pytest.approx(ours["word_perplexity"], rel=1e-5)
    assert out["wikitext"]["byte_perplexity"] == pytest.approx(ours["byte_perplexity"], rel=1e-5)


def test_evaluate_lm_eval_protocol_on_local_data(tok):
    model = tiny_pythia().train()
    out = evaluate(model, tok, ["lambada", "hellaswag", "arc_easy"], protocol="lm-eval", limit=2, progress=False)
    assert all(m.training for m in model.modules())  # lm-eval's own model.eval() was undone
    assert set(out["lambada"]) >= {"acc", "perplexity"} and 0 <= out["lambada"]["acc"] <= 1
    assert set(out["hellaswag"]) >= {"acc", "acc_norm"}
    assert "no local data" in out["arc_easy"]["unavailable"]


def test_run_lm_eval_errors_are_one_line(model, tok, monkeypatch):
    with pytest.raises(LmEvalUnavailableError) as err:
        run_lm_eval(model, tok, ["arc_easy"], data_source="local")
    assert "\n" not in str(err.value) and "arc_easy" in str(err.value)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("mmpreproj.eval.lm_eval_bridge.hub_reachable", lambda timeout=3.0: False)
    # an unreachable hub fails at once: no network attempt, and no lm-eval task indexing, model wrapping or run
    attempts = refuse_network(monkeypatch)
    reached = []
    for name in ("_task_manager", "make_hflm"):
        monkeypatch.setattr(f"mmpreproj.eval.lm_eval_bridge.{name}", lambda *a, _n=name, **k: reached.append(_n))
    monkeypatch.setattr("lm_eval.simple_evaluate", lambda *a, **k: reached.append("simple_evaluate"))
    with pytest.raises(LmEvalUnavailableError) as err:
        run_lm_eval(model, tok, ["lambada_openai"], data_source="hub")
    assert attempts == [] and reached == []
    assert str(err.value) == (
        "cannot download the data of lm-eval task(s) lambada_openai (no network?); use --data-source local"
    )


def test_an_older_lm_eval_is_refused_in_one_line():
    """lm-eval 0.4.11 has no `lm_eval.tasks._yaml_loader` (the local tasks' YAML reader): refused up front, not with
    a ModuleNotFoundError from inside a run."""
    with pytest.raises(LmEvalUnavailableError) as err:
        check_lm_eval_version("0.4.11")
    msg = str(err.value)
    assert "lm-eval 0.4.11" in msg and f"'lm-eval>={LM_EVAL_FLOOR}'" in msg and "\n" not in msg
    check_lm_eval_version(LM_EVAL_FLOOR)
    check_lm_eval_version()  # the installed one


def test_pyproject_and_make_test_floor_name_the_lm_eval_floor():
    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    pins = [d for group in ("eval", "dev") for d in project["optional-dependencies"][group] if d.startswith("lm-eval")]
    assert pins == [f"lm-eval>={LM_EVAL_FLOOR}"] * 2
    assert f"FLOOR_LM_EVAL ?= {LM_EVAL_FLOOR}" in (root / "Makefile").read_text()
