"""Hub sources fail fast, in one line, without network (mocked: no test ever downloads)."""

from __future__ import annotations

import time

import pytest

from mmpreproj.data import DataUnavailableError, hellaswag_examples, lambada_examples, wikitext_lines
from mmpreproj.data import hub as hub_mod
from tests.helpers.net_guard import refuse_network


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_unreachable_hub_fails_before_calling_datasets(monkeypatch):
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub_mod, "hub_reachable", lambda timeout=3.0: False)

    def boom(*a, **k):
        raise AssertionError("datasets.load_dataset must not be called when the hub is unreachable")

    monkeypatch.setattr("datasets.load_dataset", boom)
    with pytest.raises(RuntimeError) as err:
        wikitext_lines("validation", source="hub")
    assert _one_line(err) == (
        "cannot download 'wikitext/wikitext-103-raw-v1' (no network?); use --data-source local or pass a local path"
    )


def test_datasets_failure_becomes_one_line(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'EleutherAI/lambada_openai' on the Hub (OfflineModeIsEnabled)\nmore")

    monkeypatch.setattr("datasets.load_dataset", offline)
    with pytest.raises(DataUnavailableError) as err:
        lambada_examples(5, source="hub")
    msg = _one_line(err)
    assert "EleutherAI/lambada_openai/en" in msg and "OfflineModeIsEnabled" in msg and "--data-source local" in msg


def test_real_offline_mode_is_quick(monkeypatch, tmp_path):
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # datasets / huggingface_hub read the flags at import time: pin them too, so nothing can be downloaded
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)  # datasets < 2.20 has none
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)  # an empty cache
    # "quick" means: it neither tries the network (a connect or DNS lookup, to time out or be retried) nor waits
    attempts = refuse_network(monkeypatch)
    sleeps = []
    monkeypatch.setattr(time, "sleep", lambda s: sleeps.append(s))
    with pytest.raises(DataUnavailableError) as err:
        hellaswag_examples(5, source="hub")
    assert attempts == [] and sleeps == []
    assert "Rowan/hellaswag" in _one_line(err)


def test_probe_reports_unreachable_endpoint(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    assert hub_mod.hub_reachable(timeout=0.5) is False
