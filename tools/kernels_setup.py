"""What every kernel benchmark shares: the model shapes, the KV pools and draft selections they run on, and
the timing (CUDA-graph replays with L2 flushed, medians in microseconds)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
import triton.testing

from benchmarks.meta import device_name, git_commit, package_version

BUDGET_RATIO = 0.05
TAIL = 16  # recent verified tokens + drafts + current token
VERIFY_ROWS = 9  # k = 8 drafts + 1
SGLANG_MAX_KV_SPLITS = 8  # SGLang's --triton-attention-num-kv-splits default
DEVICE = "cuda"


@dataclass(frozen=True)
class Shape:
    name: str
    h_q: int
    h_kv: int
    d: int
    num_layers: int
    qk_norm: bool = False  # a per-head RMS norm of q and k before their rotary embedding (Qwen3)


SHAPES = (
    Shape("qwen3-8b", 32, 8, 128, 36, qk_norm=True),
    Shape("qwen3-1.7b", 16, 8, 128, 28, qk_norm=True),
    Shape("smollm2-135m", 9, 3, 64, 30),
)


def captured(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """``fn`` captured in a CUDA graph, after a call on a side stream (compiles and plans outside the capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def bench_us(fn: Callable[[], object]) -> float:
    """Median GPU time of `fn` replayed from a CUDA graph, L2 flushed before each replay."""
    fn()  # compile / plan outside the capture
    torch.cuda.synchronize()
    graph = captured(fn)
    ms = triton.testing.do_bench(graph.replay, warmup=10, rep=60, return_mode="median")
    del graph
    return ms * 1e3


def replay_ms(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Mean ms of one replay over ``replays`` back-to-back replays (after an untimed one), between two events: for
    work that reads more than L2 holds, where flushing it between replays changes nothing."""
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def graph_ms(fn: Callable[[], object], replays: int) -> float:
    """``replay_ms`` of ``fn`` captured in a CUDA graph, the graph freed after (its memory pool, before the next
    capture of a probe that captures several variants)."""
    graph = captured(fn)
    ms = replay_ms(graph, replays)
    del graph
    torch.cuda.empty_cache()
    return ms


def timed_or_note(fn: Callable[[], object] | str) -> float | str:
    """Time a baseline; one that cannot be captured in a CUDA graph is timed eagerly (L2 still flushed)."""
    if isinstance(fn, str):
        return fn
    try:
        return bench_us(fn)
    except Exception as exc:
        print(f"note: baseline timed without a CUDA graph ({exc!r})", flush=True)
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3


def draft_prologue(
    shape: Shape, k_new: torch.Tensor, v_new: torch.Tensor, req_to_token: torch.Tensor, seq_lens: torch.Tensor
) -> dict[str, Any]:
    """``sparse_decode_fwd``'s keyword arguments for the prologue a draft step launches it with by default
    (``--pillar-draft-prologue fused``): the step's key and value (k_new, v_new [bs, H_kv, D]) stored by the launch
    into the slot of request b's last position (row b of req_to_token), q and the key rotated there (neox, SGLang's
    cos | sin cache layout) and, for a model with one, their per-head RMS norm first (unit weights: the arithmetic,
    not the values, sets the time). Built once, outside any capture (it reads the longest length on the host)."""
    bs, d = seq_lens.shape[0], shape.d
    last = seq_lens - 1
    out_loc = req_to_token[torch.arange(bs, device=seq_lens.device), last].long()
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, d, 2, device=seq_lens.device, dtype=torch.float32) / d)
    angles = torch.arange(int(seq_lens.max()), device=seq_lens.device, dtype=torch.float32)[:, None] * inv_freq
    kwargs: dict[str, Any] = {
        "new_kv": (k_new, v_new, out_loc),
        "rope": (torch.cat([angles.cos(), angles.sin()], -1), last),
    }
    if shape.qk_norm:
        weight = torch.ones(d, device=seq_lens.device, dtype=k_new.dtype)
        kwargs["qk_norm"] = (weight, weight, 1e-6, 1e-6)
    return kwargs


def budget(seq_len: int) -> int:
    return math.ceil(BUDGET_RATIO * seq_len)


def make_pool(shape: Shape, bs: int, seq_len: int):
    """KV pool with each request's tokens in one contiguous slot range, as a fresh prefill leaves them."""
    slots = bs * seq_len + 1
    k = torch.randn(slots, shape.h_kv, shape.d, device=DEVICE, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    req_to_token = (1 + torch.arange(bs * seq_len, device=DEVICE, dtype=torch.int32)).view(bs, seq_len)
    return k, v, req_to_token


def random_selection(bs: int, h_kv: int, cand: int, cnt: int, kmax: int) -> torch.Tensor:
    """Sorted random positions in [0, cand), `cnt` per (request, KV head), -1 padded to kmax."""
    pos = torch.rand(bs * h_kv, cand, device=DEVICE).topk(cnt, dim=1).indices.sort(dim=1).values
    sel = torch.full((bs, h_kv, kmax), -1, dtype=torch.int32, device=DEVICE)
    sel[:, :, :cnt] = pos.view(bs, h_kv, cnt).to(torch.int32)
    return sel


def draft_selection(shape: Shape, bs: int, seq_len: int, kv_bytes: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """A draft step's random per-head selections at the 5 % budget: (sel [bs, H_kv, Kmax] int32, sel_cnt [bs],
    positions per head, bytes the sparse kernel gathers: K/V + slot index per attended token incl. the TAIL,
    and the selected positions themselves)."""
    cnt = budget(seq_len)
    sel = random_selection(bs, shape.h_kv, seq_len - TAIL, cnt, triton.cdiv(cnt, 128) * 128)
    sel_cnt = torch.full((bs,), cnt, dtype=torch.int32, device=DEVICE)
    gathered = bs * shape.h_kv * ((cnt + TAIL) * (2 * shape.d * kv_bytes + 4) + cnt * 4)
    return sel, sel_cnt, cnt, gathered


def mixed_lengths(bs: int, seq_len: int) -> list[int]:
    """A serving batch's prefix lengths: spread evenly over [L/8, 2L - L/8] (mean L) in a fixed random order,
    as requests that started one after another hold them (one request: L itself)."""
    if bs == 1:
        return [seq_len]
    lo, hi = seq_len // 8, 2 * seq_len - seq_len // 8
    lens = [lo + (hi - lo) * i // (bs - 1) for i in range(bs)]
    order = torch.randperm(bs, generator=torch.Generator().manual_seed(0)).tolist()
    return [lens[i] for i in order]


def prefix_index(per_req: list[int], req_to_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr, kv_indices) of prefixes of these lengths, laid over the pool's first sum(per_req) slots
    (the pool holds bs x seq_len of them)."""
    kv_indptr = torch.tensor([0] + per_req, device=DEVICE, dtype=torch.int32).cumsum(0).to(torch.int32)
    return kv_indptr, req_to_token.flatten()[: sum(per_req)].to(torch.int64)


def request_table(per_req: list[int], req_to_token: torch.Tensor) -> torch.Tensor:
    """A req_to_token table [bs, max(per_req)] for prefixes of these lengths, laid one after another over the
    pool's slots as ``prefix_index`` lays them (padding: slot 1)."""
    flat = req_to_token.flatten()
    table = torch.ones((len(per_req), max(per_req)), dtype=torch.int32, device=DEVICE)
    start = 0
    for i, n in enumerate(per_req):
        table[i, :n] = flat[start : start + n]
        start += n
    return table


def provenance(kind: str) -> dict[str, Any]:
    """The fields every probe's JSON opens with: its kind, the device, the date, the commit and the versions."""
    return {
        "kind": kind,
        "device": device_name(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "sglang": package_version("sglang"),
    }


def write_result(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
