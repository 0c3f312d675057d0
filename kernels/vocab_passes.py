"""The host side of the vocabulary-parallel passes: their scratch buffers and the order of their launches.

``PassRows`` is what the passes read (the logits, their requests' sampling parameters, the launch
parameters); ``VocabPasses`` holds the scratch of n rows and launches the passes of ``logit_bins``
with the plans of ``cut_plan`` between them: the top list (``top_list``) and the bracket stage
(``bracket``). The target filter and the draft sampler both run on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .cut_plan import bracket_plan_kernel, top_plan_kernel
from .logit_bins import DEPTH, GREEDY_EPS, NB, PLAN_F, PLAN_I, STATS, _gather_kernel, _hist_kernel, _stats_kernel
from .top_candidates import _candidate_kernel


@dataclass
class VocabPasses:
    """Scratch and launches of the vocabulary-parallel passes over n rows of n_chunks chunks (NCH: n_chunks
    rounded up to a power of two). stats [n, n_chunks, STATS] f32; hist [n, n_chunks, NB] i32; above_cnt,
    above_mass, list_mass (each chunk's candidates' mass), offsets [n, NCH]; range_z [n, NCH, 2] f32;
    plan_i [n, PLAN_I] i32, plan_f [n, PLAN_F] f32 (slots: ``logit_bins.PLAN_I``); list_z [n, L] f32 beside
    the caller's list ids [n, L] int32, list_n and path [n] int32 (``logit_bins.RowPath``)."""

    stats: torch.Tensor
    hist: torch.Tensor
    above_cnt: torch.Tensor
    above_mass: torch.Tensor
    list_mass: torch.Tensor
    offsets: torch.Tensor
    range_z: torch.Tensor
    plan_i: torch.Tensor
    plan_f: torch.Tensor
    list_z: torch.Tensor
    list_ids: torch.Tensor
    list_n: torch.Tensor
    path: torch.Tensor

    @classmethod
    def allocate(cls, n: int, n_chunks: int, list_cap: int, dev: torch.device) -> VocabPasses:
        nch = triton.next_power_of_2(n_chunks)
        i32 = {"dtype": torch.int32, "device": dev}
        f32 = {"dtype": torch.float32, "device": dev}
        # The buffers that start at zero come out of one block per dtype: two fill launches instead of seven,
        # in every draft step's sampling and every accept phase.
        ints = torch.zeros(n * (2 * nch + int(PLAN_I) + list_cap + 1), **i32).split(
            [n * nch, n * nch, n * int(PLAN_I), n * list_cap, n]
        )
        floats = torch.zeros(n * (2 * nch + int(PLAN_F)), **f32).split([n * nch, n * nch, n * int(PLAN_F)])
        return cls(
            torch.empty((n, n_chunks, int(STATS)), **f32),
            torch.empty((n, n_chunks, NB), **i32),
            ints[0].view(n, nch),
            floats[0].view(n, nch),
            floats[1].view(n, nch),
            ints[1].view(n, nch),
            torch.empty((n, nch, 2), **f32),
            ints[2].view(n, int(PLAN_I)),
            floats[2].view(n, int(PLAN_F)),
            torch.empty((n, list_cap), **f32),
            ints[3].view(n, list_cap),
            ints[4],
            torch.full((n,), -1, **i32),
        )

    def top_list(self, rows: PassRows, target: bool) -> None:
        """Statistics, level 1's histogram, the top list's plan and its gather (``target``: rows with no
        filter are marked NOFILTER and skipped; rows whose bin 0 overflows the list are PENDING)."""
        n = rows.logits.shape[0]
        self._stats(rows)
        self._hist(rows, first=True, skip_unfiltered=target)
        plan_args, plan_consts = self._plan_inputs(rows)
        top_plan_kernel[(n,)](self.hist, *plan_args, **plan_consts, TARGET=target)
        self._gather(rows, stage=1)

    def candidates(self, rows: PassRows) -> None:
        """Statistics and the candidate list of every filtered row (``top_candidates``); the select that
        follows decides each row's path from it."""
        self._stats(rows)
        _candidate_kernel[self._grid(rows)](
            rows.logits,
            rows.temperature,
            *rows.params,
            self.stats,
            self.list_ids,
            self.list_z,
            self.list_n,
            self.list_mass,
            self.plan_i,
            self.plan_f,
            *self._args(rows),
            self.list_ids.shape[1],
            NCH=self.offsets.shape[1],
            NB_C=NB,
            DEPTH_C=DEPTH,
            MIN_P=rows.min_p is not None,
            **rows.launch,
        )

    def bracket(self, rows: PassRows, rank_rule: bool, levels: int, level1: bool = False) -> None:
        """The bracket stage of the PENDING rows: ``levels`` plans (the first on level 1's histogram, counted
        here for the PENDING rows alone when ``level1``, each later one after its own histogram), then the
        gather of the WINDOW rows' lists."""
        n = rows.logits.shape[0]
        plan_args, plan_consts = self._plan_inputs(rows)
        for level in range(levels):
            if level or level1:
                self._hist(rows, first=level == 0, skip_unfiltered=False, pending_only=level1 and level == 0)
            bracket_plan_kernel[(n,)](
                self.hist,
                self.above_cnt,
                self.above_mass,
                *plan_args,
                **plan_consts,
                FIRST=level == 0,
                LAST=level == levels - 1,
                RANK=rank_rule,
            )
        self._gather(rows, stage=2)

    def _plan_inputs(self, rows: PassRows) -> tuple[tuple, dict[str, object]]:
        """What both plan kernels (``cut_plan``) take after their histogram inputs: the row statistics, the
        sampling parameters, the plan state they write, the sizes; and their shared constexprs."""
        args = (
            self.stats, rows.temperature, *rows.params, self.plan_i, self.plan_f, self.path, self.list_n,
            self.offsets, rows.logits.shape[1], rows.repeats, self.stats.shape[1], self.list_ids.shape[1],
        )  # fmt: skip
        consts = {
            "GREEDY_EPS_C": GREEDY_EPS,
            "NB_C": NB,
            "DEPTH_C": DEPTH,
            "NCH": self.offsets.shape[1],
            "MIN_P": rows.min_p is not None,
        }
        return args, consts

    def _grid(self, rows: PassRows) -> tuple[int, int]:
        return rows.logits.shape[0], self.stats.shape[1]

    def _args(self, rows: PassRows) -> tuple[int, int, int, int]:
        """(V, row stride, repeats, chunks): what every vocabulary-parallel kernel takes after its tensors."""
        return rows.logits.shape[1], rows.logits.stride(0), rows.repeats, self.stats.shape[1]

    def _stats(self, rows: PassRows) -> None:
        _stats_kernel[self._grid(rows)](rows.logits, rows.temperature, self.stats, *self._args(rows), **rows.launch)

    def _hist(self, rows: PassRows, first: bool, skip_unfiltered: bool, pending_only: bool = False) -> None:
        _hist_kernel[self._grid(rows)](
            rows.logits,
            rows.temperature,
            *rows.params,
            self.stats,
            self.plan_i,
            self.plan_f,
            self.hist,
            self.above_cnt,
            self.above_mass,
            self.path,
            *self._args(rows),
            NB_C=NB,
            DEPTH_C=DEPTH,
            NCH=self.offsets.shape[1],
            FIRST=first,
            MIN_P=rows.min_p is not None,
            SKIP_UNFILTERED=skip_unfiltered,
            PENDING_ONLY=pending_only,
            **rows.launch,
        )

    def _gather(self, rows: PassRows, stage: int) -> None:
        _gather_kernel[self._grid(rows)](
            rows.logits,
            rows.temperature,
            self.stats,
            self.plan_i,
            self.plan_f,
            self.path,
            self.offsets,
            self.list_ids,
            self.list_z,
            self.above_mass,
            self.range_z,
            *self._args(rows),
            self.list_ids.shape[1],
            NB_C=NB,
            NCH=self.offsets.shape[1],
            STAGE=stage,
            **rows.launch,
        )


@dataclass(frozen=True)
class PassRows:
    """What the vocabulary-parallel passes read: logits [n, V] (last dim contiguous), their requests' sampling
    parameters (temperature, top_p [n / repeats] float; top_k [n / repeats] int; min_p likewise or None),
    and the launch parameters: tokens per program (``chunk``, a multiple of ``block_v``), tile, warps."""

    logits: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor | None
    repeats: int
    chunk: int
    block_v: int
    num_warps: int

    def __post_init__(self) -> None:
        # A tile narrower than the program's threads is held replicated across them. Compiled (Triton 3.6, H200),
        # the target filter's rows came out wrong at 32-token tiles on 4 warps where the interpreter's were right
        # (gpu_tests_h200_10bafe1.log; the served 2048-token tiles were right): the passes' histograms and
        # list writes assume each token is one thread's.
        if self.block_v < 32 * self.num_warps:
            raise ValueError(
                f"block_v {self.block_v} must hold a token a thread: at least 32 x num_warps ({32 * self.num_warps})"
            )

    @property
    def params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(top_k, top_p, min_p) as the kernels take them: top_p stands in for an absent min_p (never read)."""
        return self.top_k, self.top_p, self.top_p if self.min_p is None else self.min_p

    @property
    def launch(self) -> dict[str, object]:
        return {"GREEDY_EPS_C": GREEDY_EPS, "CHUNK_C": self.chunk, "BLOCK_V": self.block_v, "num_warps": self.num_warps}
