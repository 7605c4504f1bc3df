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
    monkeypatch.setattr(headline, "CLAIMS", (claim,))  # the one page copied
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


def test_a_toy_result_sentence_fails_when_its_file_changes(tmp_path, monkeypatch):
    """The mini-ViT sentence is filled from summary.json: a changed comparison there makes the page's words stale."""
    from recipes import numbers_pages

    for name in ("summary.json", "summary_open_clip.json"):
        (tmp_path / name).write_text((numbers_pages.MINI_VIT / name).read_text())
    claim = next(c for c in numbers_pages.CLAIMS if "LoRA beats pre-projection + skip" in c.template)
    assert headline.stale_claims() == []
    data = json.loads((tmp_path / "summary.json").read_text())
    data["summary"]["preproj_skip"]["vs_lora"]["diff"] = -0.05  # 5.0 points behind LoRA instead of 3.9
    (tmp_path / "summary.json").write_text(json.dumps(data))
    monkeypatch.setattr(numbers_pages, "MINI_VIT", tmp_path)
    assert "by 5.0 points" in claim.text()
    assert headline.stale_claims() == [f"{claim.page}: {claim.text()!r}"]


def test_the_mini_vit_block_is_the_table_the_probe_wrote():
    """numbers_pages rebuilds the probe's table from its per-seed summary; it equals the one the recipe stored."""
    from recipes import numbers_pages

    stored = json.loads((numbers_pages.MINI_VIT / "summary.json").read_text())["table"]
    assert numbers_pages.mini_vit_table_block() == stored
