"""KV heads that draft over the whole prefix (sglang_sparsespec/selection/dense_heads.py): the list's grammar, the
launch's refusals (a head the model does not have, several GPUs), the per-layer mask the draft kernel reads."""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.selection.dense_heads import dense_head_mask, dense_heads_gap, parse_dense_heads
from sglang_sparsespec.selection.state import PlanState


def test_the_list_parses_sorted_and_unique_and_refuses_other_items() -> None:
    assert parse_dense_heads("20.1+ 7.2+7.2+") == ((7, 2), (20, 1))
    assert parse_dense_heads("") == ()
    for bad in ("7", "7.x", "a.1", "7.2.1", "-1.0", "7:2", "7.2,8.0", "1.\u00b2"):  # a superscript is a digit, no int
        with pytest.raises(ValueError, match="LAYER.HEAD"):
            parse_dense_heads(bad)


def test_heads_past_the_model_are_named() -> None:
    assert dense_heads_gap("29.2+0.0", num_layers=30, num_kv_heads=3) is None
    gap = dense_heads_gap("30.0+7.3+7.2", num_layers=30, num_kv_heads=3)
    assert gap is not None and "names 7.3, 30.0:" in gap and "30 layers of 3 KV heads" in gap


def test_the_mask_marks_each_listed_head_and_the_plan_state_serves_it_per_layer() -> None:
    assert dense_head_mask("", 4, 2, torch.device("cpu")) is None
    mask = dense_head_mask("1.0+3.1+1.1", 4, 2, torch.device("cpu"))
    assert [None if m is None else m.tolist() for m in mask] == [None, [1, 1], None, [0, 1]]
    assert mask[1].dtype == torch.int32
    with pytest.raises(ValueError, match="4 layers of 2 KV heads"):
        dense_head_mask("4.0", 4, 2, torch.device("cpu"))
    state = PlanState.allocate(3, 4, 2, per_head=True, kmax=8, device=torch.device("cpu"))
    assert state.dense_heads(1) is None
    state.dense = mask
    assert state.dense_heads(3).tolist() == [0, 1]


def test_the_launch_refuses_unknown_heads_and_several_gpus(llama_config_dir, monkeypatch) -> None:
    from test_plugin import _args, one_gpu_only

    monkeypatch.setenv("SPARSESPEC_DENSE_HEADS", "1.0")
    one_gpu_only(llama_config_dir)
    monkeypatch.setenv("SPARSESPEC_DENSE_HEADS", "1.0+99.0")
    with pytest.raises(ValueError, match="names 99.0: the model has") as err:
        _args(llama_config_dir)
    assert "\n" not in str(err.value)
    monkeypatch.setenv("SPARSESPEC_DENSE_HEADS", "1-0")
    with pytest.raises(ValueError, match="LAYER.HEAD"):
        _args(llama_config_dir)
