"""The training data: line filter, padding masked by length (not by eos id), packing, sources, data order."""

from __future__ import annotations

import gzip

import pytest
import torch

from mmpreproj.train import DataUnavailableError, TrainConfig, build_examples, pack_lines, pad_lines, read_lines
from mmpreproj.train.data import IGNORE_INDEX, LMExamples, select_lines
from mmpreproj.train.order import ShardedOrder
from tests.helpers.training import EOS, byte_tokenizer


def test_select_keeps_first_n_lines_longer_than_min_chars_unstripped():
    lines = ["x" * 50 + "\n", "  " + "y" * 51 + "  \n", "\n", " " + "z" * 60 + "\n", "w" * 80 + "\n", "v" * 90]
    assert select_lines(lines, num_lines=2, min_chars=50) == ["  " + "y" * 51 + "  \n", " " + "z" * 60 + "\n"]
    assert len(select_lines(lines, num_lines=10, min_chars=50)) == 4  # exactly 50 characters is not longer


def test_local_file_lines_keep_their_newline_plain_or_gzip(tmp_path):
    f, z = tmp_path / "train.txt", tmp_path / "train.txt.gz"
    f.write_text(" = Heading = \n a line\n last")
    z.write_bytes(gzip.compress(f.read_bytes()))
    assert list(read_lines(str(f))) == list(read_lines(str(z))) == [" = Heading = \n", " a line\n", " last"]


def test_missing_file_and_offline_hub_fail_in_one_line(monkeypatch):
    with pytest.raises(DataUnavailableError, match="data file not found: ./nope.txt"):
        list(read_lines("./nope.txt"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataUnavailableError) as err:
        list(read_lines("wikitext", "wikitext-103-raw-v1"))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("cannot download wikitext (wikitext-103-raw-v1, split train)")
    assert msg.endswith("pass a local file with --data PATH")


def test_pad_lines_masks_padding_by_length_and_keeps_a_real_eos():
    tok = byte_tokenizer()
    text = f"ab{EOS}cd"  # a real eos inside the text: tokens a b eos c d
    data = pad_lines([text, "0123456789ABCDEF"], tok, max_len=8)
    assert data.input_ids.shape == (2, 8) and data.input_ids.dtype == torch.long
    ids, labels, mask = data.input_ids[0], data.labels[0], data.attention_mask[0]
    assert ids[2] == tok.eos_token_id == 0 and labels[2] == 0  # the real eos keeps its label
    assert ids[5:].tolist() == [0, 0, 0]  # pad = eos
    assert labels[5:].tolist() == [IGNORE_INDEX] * 3  # padding (first pad included) has no label
    assert mask.tolist() == [1] * 5 + [0] * 3
    assert data.input_ids[1].tolist() == tok("01234567")["input_ids"]  # truncated to max_len
    assert data.attention_mask[1].all() and (data.labels[1] == data.input_ids[1]).all()


def test_packing_fills_full_blocks_with_eos_separators():
    tok = byte_tokenizer()
    lines = ["abcde", "fgh", "ijklmnop", "qr"]  # 5+1 + 3+1 + 8+1 + 2+1 = 22 tokens -> 2 blocks of 8, tail dropped
    data = pack_lines(lines, tok, max_len=8)
    assert data.input_ids.shape == (2, 8) and data.attention_mask.all()
    stream = data.input_ids.flatten().tolist()
    assert stream[:10] == tok("abcde")["input_ids"] + [0] + tok("fgh")["input_ids"] + [0]
    assert torch.equal(data.labels, data.input_ids)  # every position, eos separators included, is labelled


def test_build_examples_from_a_local_file(tmp_path):
    f = tmp_path / "train.txt"
    f.write_text("".join(f" line {i:02d} " + "x" * (40 + 3 * i) + "\n" for i in range(10)))
    cfg = TrainConfig(data=str(f), data_config=None, num_lines=3, min_chars=50, max_len=64)
    data = build_examples(cfg, byte_tokenizer())
    assert len(data) == 3  # lines 1-3: the first whose stripped text exceeds 50 chars (line 0: 48)
    assert data.attention_mask.sum(1).tolist() == [53, 56, 59]  # byte tokens, newline included
    packed = build_examples(cfg.replace(packing=True, max_len=32), byte_tokenizer())
    assert packed.input_ids.shape == ((53 + 56 + 59 + 3) // 32, 32)


def test_batch_trims_to_the_longest_row():
    data = LMExamples.random(6, 10, 50, seed=0, min_len=3)
    lengths = data.attention_mask.sum(1)
    b = data.batch([1, 4], trim=True)
    assert b["input_ids"].shape == (2, int(lengths[[1, 4]].max()))
    assert data.batch([1, 4], trim=False)["input_ids"].shape == (2, 10)


def test_sharded_order_partitions_each_epoch_and_crosses_epochs():
    n, world = 10, 3
    orders = [ShardedOrder(n, seed=5, rank=r, world_size=world) for r in range(world)]
    epoch0 = [i for o in orders for i in o.epoch(0)]
    assert len(epoch0) == 12 and set(epoch0) == set(range(n))  # padded to 4 per rank, every example once+
    assert orders[0].epoch(0) != orders[0].epoch(1)  # reshuffled per epoch
    o = orders[1]
    assert o.batch(1, 3) == [o.epoch(0)[3], o.epoch(1)[0], o.epoch(1)[1]]  # batch 1 spans the epoch border
    assert ShardedOrder(n, seed=5, rank=1, world_size=world).batch(7, 3) == o.batch(7, 3)  # addressable


def test_mini_preset_reads_the_shipped_wikitext_lines():
    from mmpreproj.train import get_preset

    cfg = get_preset("mini")
    lines = select_lines(read_lines(cfg.data), cfg.num_lines, cfg.min_chars)
    assert len(lines) > 1000 and all(len(line.strip()) > 50 and line.endswith("\n") for line in lines)
