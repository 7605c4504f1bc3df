"""The shared scoring primitive against a hand-written single-sequence loop; batching; model state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mmpreproj.data import pythia_tokenizer
from mmpreproj.eval import ContinuationScore, score_continuations
from tests.helpers.eval_models import ForcedNext, tiny_pythia
from tests.helpers.procs import HANG_GUARD_S


def hand_score(model: nn.Module, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
    """One sequence, one forward, an explicit loop over continuation positions."""
    seq = torch.tensor([ctx + cont])
    with torch.no_grad():
        logits = model(input_ids=seq).logits[0]  # (S, V)
    total, greedy = 0.0, True
    for k, tok in enumerate(cont):
        pos = len(ctx) + k - 1  # logits at pos predict token pos + 1
        lp = torch.log_softmax(logits[pos].double(), dim=-1)
        total += float(lp[tok])
        greedy &= int(lp.argmax()) == tok
    return total, greedy


@pytest.fixture(scope="module")
def tok():
    return pythia_tokenizer()


@pytest.fixture(scope="module")
def requests(tok):
    texts = [
        ("The cat sat on the", " mat"),
        ("In 1998, the river", " flooded the lower town twice"),
        ("A", " Pythia model"),
        (
            "Homarus gammarus, known as the European lobster or common lobster, is a species of",
            " clawed lobster",
        ),
    ]
    return [(tok(c)["input_ids"], tok(x, add_special_tokens=False)["input_ids"]) for c, x in texts]


def test_matches_hand_loop(requests):
    model = tiny_pythia()
    got = score_continuations(model, requests, batch_size=4)
    assert all(isinstance(s, ContinuationScore) for s in got)
    for (ctx, cont), s in zip(requests, got):
        lp, greedy = hand_score(model, ctx, cont)
        assert s.n_tokens == len(cont)
        assert s.logprob == pytest.approx(lp, abs=1e-5)
        assert s.greedy == greedy


def test_greedy_requires_every_token(requests):
    ctx, cont = requests[1]
    assert len(cont) >= 3
    forced_all = {tuple(ctx + cont[:k]): cont[k] for k in range(len(cont))}
    forced_some = {k: v for i, (k, v) in enumerate(forced_all.items()) if i != 1}  # 2nd token not forced
    model = tiny_pythia()
    full, partial = ForcedNext(model, forced_all), ForcedNext(model, forced_some)
    assert score_continuations(full, [(ctx, cont)])[0].greedy is True
    assert hand_score(full, ctx, cont)[1] is True
    s = score_continuations(partial, [(ctx, cont)])[0]
    assert s.greedy is False and hand_score(partial, ctx, cont)[1] is False
    assert s.logprob > score_continuations(model, [(ctx, cont)])[0].logprob  # forcing did raise the others


@pytest.mark.parametrize("batch_size", [2, 3])
def test_batched_equals_one_at_a_time(requests, batch_size):
    model = tiny_pythia()
    many = requests + [(c[:3], x) for c, x in requests]  # different lengths in one batch
    single = score_continuations(model, many, batch_size=1)
    batched = score_continuations(model, many, batch_size=batch_size)
    for a, b in zip(single, batched):
        assert a.n_tokens == b.n_tokens and a.greedy == b.greedy
        assert b.logprob == pytest.approx(a.logprob, abs=1e-5)


def test_pad_id_is_never_seen(requests):
    model = tiny_pythia()
    a = score_continuations(model, requests, batch_size=4, pad_id=0)
    b = score_continuations(model, requests, batch_size=4, pad_id=12345)
    assert [s.logprob for s in a] == pytest.approx([s.logprob for s in b], abs=1e-5)


def test_restores_training_flags_and_records_no_grad(requests):
    model = tiny_pythia().train()
    model.gpt_neox.layers[0].eval()  # a mixed state must come back exactly
    before = {n: m.training for n, m in model.named_modules()}
    score_continuations(model, requests[:2])
    assert {n: m.training for n, m in model.named_modules()} == before
    assert all(p.grad is None for p in model.parameters())


def test_dropout_is_off_while_scoring(requests):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=50304, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, hidden_dropout=0.5, attention_dropout=0.5)  # fmt: skip
    model = GPTNeoXForCausalLM(cfg).train()
    a = score_continuations(model, requests[:2])
    b = score_continuations(model, requests[:2])
    assert [s.logprob for s in a] == [s.logprob for s in b]
    assert model.training


def test_rejects_empty_parts():
    model = tiny_pythia()
    with pytest.raises(ValueError, match="non-empty"):
        score_continuations(model, [([1, 2], [])])
    with pytest.raises(ValueError, match="non-empty"):
        score_continuations(model, [([], [3])])


@pytest.mark.slow
def test_encoding_a_text_longer_than_the_tokenizer_limit_prints_no_indexing_warning():
    """The evaluators window long documents themselves: transformers' length warning must not reach users.

    In a subprocess: transformers' log handler holds the stderr of the moment it was made, which pytest swaps.
    """
    import subprocess
    import sys

    code = (
        "from mmpreproj.train.models import load_tokenizer\n"
        "from mmpreproj.eval.runtime import encode\n"
        "tok = load_tokenizer('assets/mini-pythia')\n"  # model_max_length 512
        "text = 'the river flooded the lower town ' * 200\n"
        "assert len(encode(tok, text)) > tok.model_max_length\n"
        "import sys; print('ENCODED', file=sys.stderr, flush=True)\n"
        "tok(text)\n"  # the same call without verbose=False warns: the check can fail
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    before, marker, after = done.stderr.partition("ENCODED")
    assert marker and "indexing errors" not in before
    assert "indexing errors" in after  # from the plain call
