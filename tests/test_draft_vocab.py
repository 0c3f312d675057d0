"""The draft vocabulary (sglang_sparsespec/draft_vocab.py): the first ids before any traffic, the most counted ids
after a refresh (ties and the unseen in id order), kept ascending with their LM-head rows, a refresh every so many
observations, padding ignored, and the picks mapped back to token ids."""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.draft_vocab import DraftVocab


def _weight(rows: int = 12, cols: int = 4) -> torch.Tensor:
    return torch.arange(rows * cols, dtype=torch.float32).view(rows, cols).to(torch.bfloat16)


def test_before_any_traffic_the_first_ids() -> None:
    vocab = DraftVocab(_weight(), 5)
    assert vocab.ids.tolist() == [0, 1, 2, 3, 4] and vocab.size == 5
    assert torch.equal(vocab.rows, _weight()[:5])


def test_a_refresh_keeps_the_most_counted_ids_ascending_with_their_rows() -> None:
    weight = _weight()
    vocab = DraftVocab(weight, 4, refresh_every=1000)
    vocab.observe(torch.tensor([[9, 9, 9], [7, 7, 3]]))  # 9 x3, 7 x2, 3 x1; then ties at 0 in id order: 0
    vocab.observe(torch.tensor([-1, 12, 100]))  # padding and ids past the vocabulary are not counted
    assert vocab.counts.sum() == 6
    vocab.refresh()
    assert vocab.ids.tolist() == [0, 3, 7, 9]
    assert torch.equal(vocab.rows, weight[[0, 3, 7, 9]])
    assert vocab.to_ids(torch.tensor([[3, 0], [1, 2]])).tolist() == [[9, 0], [3, 7]]


def test_observations_refresh_on_their_cadence() -> None:
    vocab = DraftVocab(_weight(), 2, refresh_every=3)
    vocab.observe(torch.tensor([11, 11]))
    vocab.observe(torch.tensor([10]))
    assert vocab.ids.tolist() == [0, 1]  # two observations: not yet
    ids_buffer, rows_buffer = vocab.ids, vocab.rows
    vocab.observe(torch.tensor([5]))
    assert vocab.ids.tolist() == [5, 11]  # 11 twice; 5 and 10 once each, the lower id first
    assert vocab.ids is ids_buffer and vocab.rows is rows_buffer  # refreshed in place: the graphs' buffers


@pytest.mark.parametrize("size", [0, 12, 13])
def test_a_vocabulary_as_wide_as_the_head_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="0 < size"):
        DraftVocab(_weight(), size)


def test_the_launch_takes_a_draft_vocabulary_on_one_gpu_only(llama_config_dir, monkeypatch) -> None:
    from test_plugin import _args, one_gpu_only

    monkeypatch.setenv("SPARSESPEC_DRAFT_VOCAB", "24576")
    one_gpu_only(llama_config_dir)
    monkeypatch.setenv("SPARSESPEC_DRAFT_VOCAB", "100")
    with pytest.raises(ValueError, match=r"DRAFT_VOCAB must be 0 \(off\) or >= 1024"):
        _args(llama_config_dir)


def test_a_draft_vocabulary_refused_beside_mixed_phases_or_the_fp8_head_says_which() -> None:
    from sglang_sparsespec.config import PillarConfig

    with pytest.raises(ValueError, match="BATCH_PHASES=split and .*DRAFT_LM_HEAD=bf16, got mixed and bf16"):
        PillarConfig.from_env(8, {"SPARSESPEC_DRAFT_VOCAB": "24576", "SPARSESPEC_BATCH_PHASES": "mixed"})
    with pytest.raises(ValueError, match="got split and fp8"):
        PillarConfig.from_env(8, {"SPARSESPEC_DRAFT_VOCAB": "24576", "SPARSESPEC_DRAFT_LM_HEAD": "fp8"})
    with pytest.raises(ValueError, match="SPARSESPEC_SINK_TOKENS must be >= 0, got -1"):
        PillarConfig.from_env(8, {"SPARSESPEC_SINK_TOKENS": "-1"})
