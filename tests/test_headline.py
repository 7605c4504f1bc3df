"""The README's headline rows and docs/results.md's real-model tables are what the committed evidence files give
(`recipes/headline.py`): a number typed by hand, or evidence committed without regenerating, fails here."""

from __future__ import annotations

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
