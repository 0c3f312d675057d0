"""Scaling a PILLAR deployment out: which multi-GPU and multi-server setups launch, which are refused at
launch with one line (through SGLang's real ServerArgs validation), and the per-replica cost file."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()

from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang_sparsespec.adaptive.cost_cache import CostFile  # noqa: E402
from sglang_sparsespec.patches.contacts import resolve, resolved  # noqa: E402


def _args(model_dir: Path, **overrides):
    """What resolution decided for these ServerArgs (resolved as a launch resolves them)."""
    base = dict(
        model_path=str(model_dir),
        attention_backend="triton",
        speculative_algorithm="pillar",
        skip_tokenizer_init=True,
        device="cpu",
    )
    return resolved(resolve(ServerArgs(**{**base, **overrides})))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(dp_size=2),  # SGLang's data-parallel controller: one PILLAR replica per GPU
        dict(dp_size=2, load_balance_method="total_requests"),
        dict(nnodes=2, node_rank=1, tp_size=2, dist_init_addr="10.0.0.1:5000"),  # TP over two nodes
    ],
)
def test_data_parallel_replicas_and_multi_node_tensor_parallelism_launch(llama_config_dir, overrides):
    sa = _args(llama_config_dir, **overrides)
    assert sa.speculative_num_draft_tokens == 9 and "pillar" in sa.warmups.split(",")
    assert (sa.dp_size, sa.tp_size, sa.nnodes) == (
        overrides.get("dp_size", 1),
        overrides.get("tp_size", 1),
        overrides.get("nnodes", 1),
    )


@pytest.mark.parametrize(
    "overrides, names, why",
    [
        (dict(disaggregation_mode="prefill"), "--disaggregation-mode prefill", "at its own prefill"),
        (dict(disaggregation_mode="decode"), "--disaggregation-mode decode", "at its own prefill"),
        (
            dict(tp_size=2, dp_size=2, enable_dp_attention=True),
            "DP attention (--enable-dp-attention",
            "different batches",
        ),
    ],
)
def test_disaggregation_and_dp_attention_are_refused_with_one_line_saying_why(llama_config_dir, overrides, names, why):
    with pytest.raises(ValueError) as err:
        _args(llama_config_dir, **overrides)
    text = str(err.value)
    assert text.startswith("--speculative-algorithm PILLAR: does not support " + names) and "\n" not in text
    assert why in text and "--dp-size N" in text  # what to do instead


def _replica_saves(path: str, replica: int, rounds: int) -> None:
    cost = CostFile(Path(path), {"gpu": "H100", "model": "m", "tp_size": 1})
    for i in range(rounds):
        cost.save({f"{replica}x{i}": {"plain": float(i)}, "pad": ["x" * 64] * 200})


def test_replicas_of_one_setup_share_one_cost_file_and_never_tear_it(tmp_path):
    # Two replicas of one setup on GPUs of one kind have one identity, hence one file name.
    ident = {"gpu": "NVIDIA H100 80GB HBM3", "model": "/m", "tp_size": 1}
    a, b = CostFile.resolve("auto", ident, tmp_path), CostFile.resolve("auto", dict(ident), tmp_path)
    assert a.path == b.path
    # Replicas are processes of their own: concurrent saves each replace the file whole (a per-process
    # temporary file renamed over it), so a reader sees one replica's table or the other's, never a mix.
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_replica_saves, args=(str(a.path), r, 150)) for r in (0, 1)]
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):
        if a.path.exists():
            cells = CostFile(a.path, {"gpu": "H100", "model": "m", "tp_size": 1}).load()
            assert cells is not None and len({k.split("x")[0] for k in cells if k != "pad"}) == 1
        time.sleep(0.001)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert json.loads(a.path.read_text())["identity"]["gpu"] == "H100"
    assert not list(a.path.parent.glob(".*.tmp"))  # no temporary file left behind
