"""CPU tests of the measuring tools in tools/: FlashInfer's per-head pages against the sparse kernel's
reference, the mixed-length batches, the policy host and the mixed-GEMM projection."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# tools/ is a folder at the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def test_flashinfer_per_head_pages_attend_exactly_the_sparse_kernels_positions() -> None:
    """kernels_bench times FlashInfer's page-table decode on PILLAR's per-head selections by making each
    (request, KV head) a row of one-head pages; attention over those pages (plain torch, as FlashInfer
    computes it) must equal the sparse kernel's reference, or the timing compares different work."""
    import torch
    from sglang_sparsespec.kernels.sparse_decode_ref import sparse_decode_ref

    from tools.kernels_baselines import per_head_pages
    from tools.kernels_setup import TAIL

    gen = torch.Generator().manual_seed(0)
    bs, h_kv, group, d, seq_len, cnt = 3, 3, 3, 16, 80, 7
    slots = bs * seq_len + 5
    k = torch.randn(slots, h_kv, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(slots, h_kv, d, generator=gen).to(torch.bfloat16)
    req_to_token = torch.randperm(slots - 1, generator=gen)[: bs * seq_len].view(bs, seq_len).to(torch.int32) + 1
    tail_start = torch.full((bs,), seq_len - TAIL)
    sel = torch.stack([torch.randperm(seq_len - TAIL, generator=gen)[:cnt].sort().values for _ in range(bs * h_kv)])
    sel = sel.view(bs, h_kv, cnt).to(torch.int32)
    q = torch.randn(bs, h_kv * group, d, generator=gen)

    pages = per_head_pages(req_to_token, sel, cnt, tail_start).view(bs * h_kv, cnt + TAIL)
    k_pages, v_pages = k.view(-1, d).float(), v.view(-1, d).float()  # [slots x H_kv] one-head pages
    q_rows = q.to(torch.bfloat16).float().view(bs * h_kv, group, d)
    scores = torch.einsum("rgd,rnd->rgn", q_rows, k_pages[pages]) * d**-0.5
    out = torch.einsum("rgn,rnd->rgd", scores.softmax(-1), v_pages[pages]).view(bs, h_kv * group, d)

    ref = sparse_decode_ref(
        q,
        k,
        v,
        torch.zeros(bs, h_kv * group, d),
        req_to_token,
        torch.arange(bs),
        sel,
        torch.full((bs,), cnt),
        tail_start,
        torch.full((bs,), seq_len),
        d**-0.5,
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert len(set(pages[0].tolist())) == cnt + TAIL  # distinct pages: no position read twice


def test_mixed_lengths_keep_the_uniform_batch_mean_and_pool() -> None:
    """kernels_bench compares a mixed batch with a uniform one of the same mean on one KV pool of bs x L
    slots: the mixed lengths must spread widely, average L and fit that pool."""
    from tools.kernels_setup import mixed_lengths

    for bs, seq_len in ((256, 7000), (64, 4096), (1, 4096)):
        lens = mixed_lengths(bs, seq_len)
        assert len(lens) == bs and sum(lens) <= bs * seq_len
        assert abs(sum(lens) / bs - seq_len) <= seq_len / 8
        if bs > 1:
            assert min(lens) == seq_len // 8 and max(lens) == 2 * seq_len - seq_len // 8
            assert lens != sorted(lens)  # requests that started one after another, not by length


def test_policy_host_times_the_workers_own_round_choice(tmp_path):
    """tools.policy_host drives the worker's RoundPlanner on stand-ins: it must follow the worker."""
    from tools import policy_host
    from sglang_sparsespec.patches.round_plan import PATH_LOG_EVERY

    out = tmp_path / "host.json"
    rounds = PATH_LOG_EVERY  # the last round logs the path counts and saves the costs
    assert policy_host.main(["--out", str(out), "--batches", "1", "32", "--rounds", str(rounds)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["bs"] for r in rows] == [1, 32]
    assert all(sum(r["rounds_by_k"].values()) == rounds and r["choose_us"] > 0 for r in rows)


def test_mixed_gemm_groups_and_projection(tmp_path: Path) -> None:
    from tools.mixed_gemm import RowWork, groups, project

    tiny = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 4,
        "vocab_size": 50,
    }
    work = RowWork(tiny, max_rows=27, device="cpu")
    assert [tuple(w.shape) for w in work.layers[0]] == [(32, 16), (16, 16), (64, 16), (16, 32)]
    assert work.forward(27).shape == (27, 50) and work.forward(3).shape == (3, 50)

    assert groups(16, 8) == [2] * 7 + [1] * 2 and groups(64, 8) == [8] * 1 + [7] * 8 and sum(groups(256, 8)) == 256
    steps = {
        "servers": {
            "stock": {"rows": [{"context": 4096, "batch": 64, "step_ms": 24.0}]},
            "pillar": {
                "rows": [
                    {"context": 4096, "batch": 64, "round_ms": 96.0, "verify_ms": 32.0},
                    {"context": 4096, "batch": 16, "round_ms": 70.0, "verify_ms": 13.0},
                ]
            },
        }
    }
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(steps))
    (row,) = project([{"batch": 64, "saving_ms": 6.0}], path)  # batch 16 has no saving measured: left out
    assert (row["mixed_round_ms"], row["verify_minus_stock_step_ms"]) == (90.0, 8.0)
    assert row["change"] == pytest.approx(-1 / 16)


def test_the_draft_gemm_summary_takes_each_kernels_fastest_launch() -> None:
    """tools.draft_gemm's summary sets cuBLAS against cuBLAS fp8 and the fastest launch of each Triton kernel
    (bf16 weights, fp8 copies); launches the GPU refused are skipped (the kernel itself: test_skinny_gemm.py)."""
    from tools.draft_gemm import summary

    rows = [
        {"shape": "s", "m": 64, "proj": "o", "kernel": "cublas", "us": 6.0},
        {"shape": "s", "m": 64, "proj": "o", "kernel": "cublas_fp8", "error": "no row-wise scales"},
        {"shape": "s", "m": 64, "proj": "o", "kernel": "triton", "config": (64, 128, 1, 4, 3), "us": 4.0},
        {"shape": "s", "m": 64, "proj": "o", "kernel": "triton", "config": (32, 128, 1, 4, 3), "error": "smem"},
        {"shape": "s", "m": 64, "proj": "o", "kernel": "triton_w8", "config": (32, 128, 1, 4, 3), "us": 3.0},
    ]
    (best,) = summary(rows)
    assert best["triton_config"] == (64, 128, 1, 4, 3) and best["triton_speedup"] == pytest.approx(1.5)
    assert best["triton_w8_speedup"] == pytest.approx(2.0) and best["cublas_fp8_us"] is None


def test_the_vocab_pass_probes_bins_only_pass_bins_what_the_histogram_counts() -> None:
    """tools.vocab_pass_probe reads hist1 - bins_only as the histogram op's cost: both must visit the same tokens
    and bins (sum of b x count(b) over the histogram = the sum of the bins), else the difference means nothing."""
    import torch
    from triton_env import DEVICE

    from tools.vocab_pass_probe import pass_calls

    calls, paths, bins_sum, passes, probe_hist = pass_calls("top_p", 2, 1024, 4, vocab=3000, dev=DEVICE)
    assert {"read", "stats", "bins_only", "hist1", "gather1", "gather2", "hist1_nb64"} <= set(calls)
    assert sum(paths.values()) == 1
    calls["stats"]()
    calls["hist1"]()
    calls["bins_only"]()
    nb = passes.hist.shape[-1]
    weighted = (passes.hist.long() * torch.arange(nb, device=passes.hist.device)).sum(-1)
    assert torch.equal(weighted.cpu(), bins_sum.long().cpu()) and int(bins_sum.sum()) > 0
    # At the product's bin count the probe's histogram is the product's; at 64 bins it counts every token once.
    calls[f"hist1_nb{nb}"]()
    assert torch.equal(probe_hist.cpu(), passes.hist.cpu())
    calls["hist1_nb64"]()
    assert torch.equal(probe_hist[..., :64].sum(-1).cpu(), passes.hist.sum(-1).cpu())


def test_flashinfer_aot_install_keeps_only_the_modules_that_pass_their_check(tmp_path: Path) -> None:
    """A prebuilt module that fails its GPU check must leave FlashInfer's AOT folder again (FlashInfer then compiles
    it as before); one that passes stays; one never built is reported, not copied."""
    from types import SimpleNamespace

    from tools.flashinfer_aot import Module, install

    def failing() -> None:
        raise RuntimeError("undefined symbol: cuTensorMapEncodeTiled\nmore lines")

    src, dst = tmp_path / "built", tmp_path / "aot"
    for name in ("good", "bad"):
        (src / name).mkdir(parents=True)
        (src / name / f"{name}.so").write_bytes(b"\x7fELF")
    modules = tuple(
        Module(key, lambda name=name: SimpleNamespace(name=name), check)
        for key, name, check in (("g", "good", lambda: None), ("b", "bad", failing), ("m", "missing", lambda: None))
    )
    outcome = install(src, dst, modules)
    assert (dst / "good" / "good.so").is_file() and not (dst / "bad").exists() and not (dst / "missing").exists()
    assert outcome["g"].startswith("checked in ") and outcome["m"] == "not built"
    assert outcome["b"] == "removed (RuntimeError: undefined symbol: cuTensorMapEncodeTiled)"
