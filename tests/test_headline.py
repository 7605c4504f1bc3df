"""The README's headline rows and docs/results.md's real-model tables are what the committed evidence files give
(`recipes/headline.py`): a number typed by hand, or evidence committed without regenerating, fails here."""

from __future__ import annotations

import json

from recipes import headline


def test_the_generated_blocks_match_the_evidence_files():
    assert headline.stale_blocks() == [], "run: python recipes/headline.py"


def test_a_number_changed_by_hand_is_caught(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    text = (headline.ROOT / "README.md").read_text()
    block = headline._span(text, "headline").group(1)
    readme.write_text(text.replace(block, block.replace("29.4", "28.4"), 1))
    monkeypatch.setattr(headline, "BLOCKS", {readme: {"headline": headline.headline_block}})
    monkeypatch.setattr(headline, "ROOT", tmp_path)
    assert headline.stale_blocks() == ["README.md: headline"]
    headline.write_blocks()
    assert headline.stale_blocks() == []


def test_every_checked_sentence_is_on_its_page():
    assert headline.stale_claims() == [], (
        "edit the page's words to what the files give (python recipes/headline.py --check)"
    )


def test_a_sentence_whose_number_was_typed_by_hand_is_caught(tmp_path, monkeypatch):
    claim = headline.CLAIMS[0]
    page = tmp_path / claim.page
    text = (headline.ROOT / claim.page).read_text()
    page.write_text(text.replace(claim.text(), claim.text().replace("[0.3", "[0.2"), 1))
    monkeypatch.setattr(headline, "ROOT", tmp_path)
    assert headline.stale_claims() == [f"{claim.page}: {claim.text()!r}"]


def test_the_numbers_page_lists_every_block_and_claim():
    listed = headline.numbers_block()
    assert all(f"`{name}`" in listed for blocks in headline.BLOCKS.values() for name in blocks)
    assert set(headline.BLOCK_SOURCES) == {name for blocks in headline.BLOCKS.values() for name in blocks}
    assert listed.count("checked sentence") == len(headline.CLAIMS)


def test_demo_time_is_the_median_run_with_every_run_and_the_load(tmp_path):
    """Three demo runs: the sentence gives the middle one's wall and CPU time, lists all three, and the load range."""
    steps = [
        {"step": "set-up", "wall_s": 120.0, "cpu_s": 100.0, "load_1min_before": 0.1, "load_1min_after": 0.9},
        *(
            {"step": "demo", "repeat": i, "wall_s": w, "cpu_s": c, "load_1min_before": lb, "load_1min_after": la}
            for i, (w, c, lb, la) in enumerate(
                [(400.0, 700.0, 0.5, 1.9), (361.0, 690.0, 1.2, 2.1), (372.4, 660.0, 1.0, 1.8)]
            )
        ),
    ]
    path = tmp_path / "first_hour.json"
    path.write_text(json.dumps({"cores": 2, "date": "2026-12-06 22:00 UTC", "steps": steps}))
    text = headline.demo_time_block(path)
    assert text.startswith(
        "`make demo` took 6 min 12 s (11.0 CPU-min), the median of 3 runs (6 min 01 s, 6 min 12 s, 6 min 40 s)"
    )
    assert "load average 0.5-2.1 around them" in text
