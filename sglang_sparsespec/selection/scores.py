"""Where the verify pass leaves its attention mass for the next selection.

During a verify forward every layer's attention kernel also returns the log-sum-exp of
each query row; the score-capture kernel turns logits and LSE back into probabilities
and writes, per KV head, the mass each prefix position received (averaged over the GQA
group and the k+1 verify rows, or only the last one). This sink owns the static buffers those kernels write —
static so the writes can live inside the target's TARGET_VERIFY CUDA graph.
"""

from __future__ import annotations

import torch

from sglang_sparsespec.kernels.score_capture import score_capture


class VerifyScoreSink:
    """Static score-capture buffers of one server.

    mass: [S, H_kv, cap], flat over the verify batch in SGLang ``kv_indptr`` order:
          mass[s, h, kv_indptr[b] + t] is the mass of prefix position t of batch row b.
          per_layer=True: S = num_layers, slice s = layer, fp16 (2 bytes per score keeps
          the radix selection to two passes); per_layer=False: S = 1, the sum over layers,
          fp32 (the first layer overwrites, the others add).
    lse:  [max_rows, H_q] fp32 scratch for the attention kernel's LSE output.
    capture_on: [1] int32 device flag read by the capture kernel (inside the graph): 0 skips it.
    last_row_only: score each request's last verify row only (kernels/score_capture.py).
    ``cap`` bounds the total prefix of any verify batch.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        num_q_heads: int,
        cap: int,
        max_q_rows: int,
        per_layer: bool,
        device: torch.device,
        last_row_only: bool = False,
    ):
        self.per_layer = per_layer
        self.last_row_only = last_row_only
        self.cap = cap
        slices, dtype = (num_layers, torch.float16) if per_layer else (1, torch.float32)
        self.mass = torch.zeros((slices, num_kv_heads, cap), dtype=dtype, device=device)
        self.lse = torch.empty((max_q_rows, num_q_heads), dtype=torch.float32, device=device)
        self.capture_on = torch.ones(1, dtype=torch.int32, device=device)

    def set_capture(self, on: bool) -> None:
        """Whether the next verify pass captures scores (a device write, stream-ordered, no sync)."""
        self.capture_on.fill_(int(on))

    def lse_buffer(self, num_rows: int, num_heads: int) -> torch.Tensor:
        if num_rows > self.lse.shape[0]:
            raise RuntimeError(f"verify batch of {num_rows} query rows exceeds the LSE buffer")
        return self.lse[:num_rows, :num_heads]

    def capture_layer(
        self,
        layer_id: int,
        q: torch.Tensor,
        k_buffer: torch.Tensor,
        lse: torch.Tensor,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        sm_scale: float,
        logit_cap: float,
    ) -> None:
        score_capture(
            q,
            k_buffer,
            lse,
            qo_indptr,
            kv_indptr,
            kv_indices,
            self.mass[layer_id] if self.per_layer else self.mass[0],
            sm_scale,
            logit_cap=logit_cap,
            accumulate=not self.per_layer and layer_id != 0,
            enabled=self.capture_on,
            last_row_only=self.last_row_only,
        )

    @property
    def num_candidate_rows(self) -> int:
        """Rows of :meth:`candidates`: num_layers * H_kv, or 1."""
        return self.mass.shape[0] * self.mass.shape[1] if self.per_layer else 1

    def candidates(self) -> torch.Tensor:
        """[R, cap] selection rows: R = num_layers * H_kv (row l * H_kv + h), or 1 (all summed)."""
        if self.per_layer:
            return self.mass.view(-1, self.cap)
        return self.mass[0].sum(0, keepdim=True)

    @staticmethod
    def starts(verify_lens: torch.Tensor) -> torch.Tensor:
        """Flat offset of each verify row's prefix ([bs] int64, no host synchronisation).

        Real rows come first in a (possibly padded) verify batch, so their offsets are the
        exclusive prefix sums of their own lengths.
        """
        lens = verify_lens.to(torch.int64)
        return torch.cumsum(lens, 0) - lens
