"""DECODE forwards of the target model under PILLAR's draft backend, eager or replayed from CUDA graphs,
and the per-request host lists rounds copy into their device inputs.

Both runners that drive such forwards (``draft_runner``: draft steps and the plain-decoding step;
``mixed_runner``: mixed-phase forwards) hand this module a step *body*, a function that reads only
device buffers and runs one forward and what follows it. ``DecodeGraphs`` captures each body once
per (batch-size bucket, ``Kind``) and later either replays that graph or, where none was captured
(a batch past the largest bucket, or no graphs at all), calls the very same body eagerly, so the
eager path (the only one CPU tests can run) executes exactly what the graphs record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

import torch

logger = logging.getLogger(__name__)


class Kind(str, Enum):
    """What a captured body computes. GREEDY / SAMPLED: a draft step or mixed-phase forward of an
    all-greedy batch (drafts by argmax, accepts by argmax) or of a batch with sampled requests (drafts
    from the compact proposal, accepts by exact rejection sampling; top-k, top-p and temperature are
    per-row tensors the kernels read, so one graph serves every filter); PLAIN: the plain-decoding step."""

    GREEDY = "greedy"
    SAMPLED = "sampled"
    PLAIN = "plain"

    @classmethod
    def of(cls, sampling_info) -> Kind:
        return cls.GREEDY if sampling_info.is_all_greedy else cls.SAMPLED


GraphKey = tuple[int, Kind]  # (captured batch size, kind)


def host_rows(values: list, dtype: torch.dtype, device) -> torch.Tensor:
    """A per-request host list on ``device``, for a round's inputs. Pinned on a GPU, so the copy is
    asynchronous (no host synchronisation); the caching host allocator keeps the block until it is done."""
    pinned = torch.device(device).type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=pinned).to(device, non_blocking=True)


@dataclass
class DecodeRows:
    """One DECODE forward's rows, n of them, all on the device: tokens [n] int64 (the inputs),
    positions [n] int64 (each token's K/V goes to its request's slot of that position),
    req_pool_indices [n] int64, seq_lens [n] int64 (positions + 1)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor


def decode_forward(model_runner, backend, rows: DecodeRows) -> torch.Tensor:
    """One DECODE forward of ``rows`` through the target model with ``backend`` as its attention
    (already planned for these rows by the caller); the next-token logits [n, V]. Host work is
    Python objects only and every kernel reads the rows' device buffers, so it may be captured."""
    from sglang.srt.layers.dp_attention import DpPaddingMode, set_dp_buffer_len, set_is_extend_in_batch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    n = rows.tokens.shape[0]
    req_to_token = model_runner.req_to_token_pool.req_to_token
    fb = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=n,
        input_ids=rows.tokens,
        req_pool_indices=rows.req_pool_indices,
        seq_lens=rows.seq_lens,
        seq_lens_cpu=None,
        out_cache_loc=req_to_token[rows.req_pool_indices, rows.positions].to(torch.int64),
        seq_lens_sum=0,
        return_logprob=False,
        positions=rows.positions,
        dp_padding_mode=DpPaddingMode.get_default_mode_in_cuda_graph(),
        spec_algorithm=model_runner.spec_algorithm,
        spec_info=None,
        capture_hidden_mode=CaptureHiddenMode.NULL,
    )
    # The backend's metadata is planned outside the forward (plan(), segments): the model must not re-plan.
    fb.mark_forward_metadata_ready()
    set_dp_buffer_len(None, n, False, None)
    set_is_extend_in_batch(False)
    with forward_context(ForwardContext(attn_backend=backend)):
        return model_runner.model.forward(rows.tokens, rows.positions, fb).next_token_logits


class DecodeGraphs:
    """One runner's CUDA graphs, by (batch-size bucket, ``Kind``), in one memory pool."""

    def __init__(self, model_runner, capture_bs: list[int], max_bs: int, what: str):
        self.mr = model_runner
        self.max_bs = max_bs
        self.capture_bs = sorted(b for b in capture_bs if b <= max_bs)
        self.what = what  # the runner, in messages: "draft", "mixed"
        self.graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._stream: torch.cuda.Stream | None = None

    def bucket(self, bs: int) -> tuple[int | None, int]:
        """(the captured batch size that serves ``bs`` rows, None past the largest; the rows padded to it)."""
        graph_bs = next((b for b in self.capture_bs if b >= bs), None)
        padded = graph_bs if graph_bs is not None else bs
        if padded > self.max_bs:
            raise RuntimeError(f"PILLAR {self.what} batch {bs} exceeds max running requests {self.max_bs}")
        return graph_bs, padded

    @contextmanager
    def capturing(self, label: str) -> Iterator[None]:
        """Around a runner's captures, as SGLang's own runners capture: its ``graph_capture()`` (the
        capture stream; under tensor parallelism the custom all-reduce records the graphs' buffers and
        registers them with the other ranks on exit, and PyNccl takes the all-reduces that custom
        all-reduce does not, where torch.distributed's would be captured otherwise), its graph capture
        mode, and its gc freeze (every torch.cuda.graph() entry runs gc.collect(), which walks the whole
        server heap unless it is frozen first)."""
        from sglang.srt.distributed.parallel_state import graph_capture
        from sglang.srt.model_executor.runner import model_capture_mode
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import freeze_gc

        t0 = time.monotonic()
        try:
            with (
                graph_capture() as context,
                model_capture_mode(),
                freeze_gc(self.mr.server_args.enable_cudagraph_gc),
            ):
                self._pool, self._stream = torch.cuda.graph_pool_handle(), context.stream
                yield
                # The captures' warm-ups and input copies ran on the capture stream, which the default stream
                # does not wait for once the context is left: the first rounds must not race them.
                context.stream.synchronize()
        finally:
            self._pool = self._stream = None
        logger.info("PILLAR %s captured in %.1f s for batch sizes %s", label, time.monotonic() - t0, self.capture_bs)

    def capture(self, key: GraphKey, body: Callable[[], None], prepare: Callable[[], None]) -> None:
        """Capture ``body`` under ``key`` (inside ``capturing``): ``prepare`` loads the padding inputs,
        then one eager warm-up run on the side stream (Triton JIT must not run under capture; these
        kernels do not autotune, so a second run adds nothing; under tensor parallelism its all-reduces
        return zeros, as in SGLang's own warm-ups), then ``prepare`` again, since the warm-up advanced the
        body's state, and the capture (it records, it runs nothing)."""
        stream = self._stream
        if stream is None:
            raise RuntimeError("DecodeGraphs.capture outside capturing()")
        prepare()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            body()
        torch.cuda.current_stream().wait_stream(stream)
        prepare()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream):
            body()
        self.graphs[key] = graph

    def run(self, key: GraphKey | None, body: Callable[[], None]) -> bool:
        """Replay the graph captured under ``key``, or run ``body`` eagerly where there is none (key
        None: the batch is past every bucket). Returns whether a graph ran."""
        graph = self.graphs.get(key) if key is not None else None
        if graph is None:
            body()
            return False
        graph.replay()
        return True
