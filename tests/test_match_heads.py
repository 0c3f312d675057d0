"""KV heads that also attend each draft step's token matches (sglang_sparsespec/selection/match_heads.py): the
flag's grammar, the launch's refusals, the list rows and plan groups per layer, and the token ids the matches are
scanned in."""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.token_match import token_match_fwd, token_match_ref
from sglang_sparsespec.selection.match_heads import (
    AUTO_HEADS,
    MAX_LATEST,
    TokenIds,
    auto_heads,
    match_heads_of,
    match_heads_gap,
    parse_match_heads,
)
from sglang_sparsespec.selection.state import PlanState


def test_the_flag_parses_a_count_and_heads_and_refuses_the_rest() -> None:
    assert parse_match_heads("32@20.1+7.2+7.2") == (32, ((7, 2), (20, 1)))
    assert parse_match_heads(" ") == (0, ())
    assert parse_match_heads("64@auto") == parse_match_heads("64@auto:5") == (64, ())
    assert auto_heads("64@auto") == AUTO_HEADS and auto_heads("64@auto:5") == 5 and auto_heads("64@7.2") is None
    for bad in (
        "7.2",
        "0@7.2",
        f"{MAX_LATEST + 1}@7.2",
        "x@7.2",
        "32@",
        "32@7",
        "-1@7.2",
        "64@auto:0",
        "64@auto:x",
        "\u00b2@7.2",
        "64@auto:\u00b2",
    ):
        with pytest.raises(ValueError, match="--pillar-match-heads"):
            parse_match_heads(bad)


def test_gaps_name_unknown_heads_dense_overlaps_and_bad_values() -> None:
    assert match_heads_gap("8@29.2+0.0", num_layers=30, num_kv_heads=3) is None
    gap = match_heads_gap("8@30.0+7.2", num_layers=30, num_kv_heads=3)
    assert gap is not None and "names 30.0:" in gap and gap.startswith("--pillar-match-heads")
    gap = match_heads_gap("8@7.2+8.0", 30, 3, dense_heads="8.0+9.1")
    assert gap is not None and "both name 8.0" in gap
    assert "N@LAYER.HEAD" in match_heads_gap("7.2", 30, 3)
    assert match_heads_gap("8@auto:90", 30, 3) is None
    assert "the model has 90 KV heads" in match_heads_gap("8@auto:91", 30, 3)
    assert "the probe could list a dense head" in match_heads_gap("8@auto", 30, 3, dense_heads="8.0")


def test_auto_heads_list_none_until_a_probe_assigns_the_highest_scores_in_place() -> None:
    """With N@auto every layer's rows are views of one table (all -1: none listed), so the draft graphs captured at
    start read what the warm-up's probe writes there later: the C highest-scoring heads, rows in layer order."""
    heads = match_heads_of("16@auto:3", 4, 2, torch.device("cpu"))
    assert heads.count == 3 and all(r is not None and r.tolist() == [-1, -1] for r in heads.rows)
    captured = heads.rows[3]  # as a captured graph holds it
    scores = torch.tensor([[0.1, 0.9], [0.0, 0.2], [0.5, 0.3], [0.05, 0.8]])
    assert heads.assign(scores).tolist() == [1, 4, 7]
    assert [r.tolist() for r in heads.rows] == [[-1, 0], [-1, -1], [1, -1], [-1, 2]]
    assert captured.tolist() == [-1, 2] and heads.groups.tolist() == [1, 4, 7]
    heads.assign(torch.tensor([[1.0, 0.0], [0.9, 0.0], [0.0, 0.0], [0.0, 0.8]]))  # a later probe moves them
    assert [r.tolist() for r in heads.rows] == [[0, -1], [1, -1], [-1, -1], [-1, 2]] and heads.groups.tolist() == [
        0,
        2,
        7,
    ]
    with pytest.raises(ValueError, match="score expected"):
        heads.assign(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="only N@auto"):
        match_heads_of("16@1.0", 4, 2, torch.device("cpu")).assign(scores)


def test_the_listed_heads_get_list_rows_and_plan_groups_that_the_plan_state_serves_per_layer() -> None:
    assert match_heads_of("", 4, 2, torch.device("cpu")) is None
    heads = match_heads_of("16@3.1+1.0+1.1", 4, 2, torch.device("cpu"))
    assert [None if r is None else r.tolist() for r in heads.rows] == [None, [0, 1], None, [-1, 2]]
    assert heads.groups.tolist() == [2, 3, 7] and heads.count == 3
    with pytest.raises(ValueError, match="names 4.0"):
        match_heads_of("16@4.0", 4, 2, torch.device("cpu"))
    state = PlanState.allocate(3, 4, 2, per_head=True, kmax=8, device=torch.device("cpu"))
    assert state.match_heads(1) is None and state.token_ids is None
    state.match = heads
    assert state.match_heads(3).tolist() == [-1, 2] and state.match_heads(0) is None


def test_token_ids_take_whole_sequences_and_chains_that_the_scan_reads() -> None:
    ids = TokenIds(4, 16, "cpu")
    ids.write_sequences([2, 0], [[5, 6, 5, 7], list(range(20))])  # the second is cut at the row's width
    assert ids.ids[2, :5].tolist() == [5, 6, 5, 7, 0] and ids.ids[0].tolist() == list(range(16))
    ids.write_sequences([], [])
    ids.write_chain(torch.tensor([2, 3]), torch.tensor([4, 0]), torch.tensor([[5, 9], [1, 2]]))
    assert ids.ids[2, :7].tolist() == [5, 6, 5, 7, 5, 9, 0] and ids.ids[3, :3].tolist() == [1, 2, 0]
    # A step whose input token is 5, tail at 6: occurrences 4, 2, 0 newest first; 4 + 1 = 5 holds 9 (listed), the
    # others' successors hold 7 and 6 (listed).
    pos = torch.full((1, 8), -1, dtype=torch.int32)
    cnt = torch.zeros(1, dtype=torch.int32)
    args = (ids.ids, torch.tensor([2]), torch.tensor([5]), torch.tensor([6], dtype=torch.int32))
    token_match_fwd(*args, pos, cnt, block=4)
    assert pos[0, : cnt[0]].tolist() == [4, 5, 2, 3, 0, 1] == token_match_ref(*args, latest=4)[0]


def test_the_launch_refuses_several_gpus_mixed_phases_the_oracle_and_bad_lists(llama_config_dir, monkeypatch) -> None:
    from test_plugin import _args, one_gpu_only

    monkeypatch.setenv("SPARSESPEC_MATCH_HEADS", "16@1.0")
    one_gpu_only(llama_config_dir)
    for name, value in (("SPARSESPEC_BATCH_PHASES", "mixed"), ("SPARSESPEC_POLICY", "oracle")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match="split batch phases and a plan policy other than oracle") as err:
            _args(llama_config_dir)
        assert "\n" not in str(err.value)
        monkeypatch.delenv(name)
    for value, message in (("16@1.0+99.0", "names 99.0: the model has"), ("1.0", "N@LAYER.HEAD")):
        monkeypatch.setenv("SPARSESPEC_MATCH_HEADS", value)
        with pytest.raises(ValueError, match=message):
            _args(llama_config_dir)
    monkeypatch.setenv("SPARSESPEC_MATCH_HEADS", "16@auto")
    _args(llama_config_dir)
    with pytest.raises(ValueError, match="needs the server's warm-up, which names the heads") as err:
        _args(llama_config_dir, skip_server_warmup=True)
    assert "\n" not in str(err.value)
    monkeypatch.setenv("SPARSESPEC_MATCH_HEADS", "16@1.0")
    monkeypatch.setenv("SPARSESPEC_DENSE_HEADS", "1.0")
    with pytest.raises(ValueError, match="both name 1.0"):
        _args(llama_config_dir)
