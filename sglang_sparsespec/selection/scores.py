"""Where the verify pass leaves its attention mass for the next selection.

During a verify forward every layer's attention kernel also returns the log-sum-exp of
each query row; the score-capture kernel turns logits and LSE back into probabilities
and adds, per KV head, the mass each prefix position received (averaged over the GQA
group and the k+1 verify rows). This sink owns the static buffers that the kernels
write — static so the writes can live inside the target's TARGET_VERIFY CUDA graph.
"""

from __future__ import annotations

import torch

from sglang_sparsespec.kernels.score_capture import score_capture


class VerifyScoreSink:
    """Static score-capture buffers of one server.

    mass: [H_kv, cap] float32, flat over the verify batch in SGLang ``kv_indptr`` order:
          mass[h, kv_indptr[b] + t] is the summed-over-layers mass of prefix position t
          of batch row b. ``cap`` bounds the total prefix of any verify batch.
    lse:  [max_rows, H_q] float32 scratch for the attention kernel's LSE output.
    Layers listed in ``layers`` are scored; the first of them overwrites, the others add.
    """

    def __init__(
        self,
        num_kv_heads: int,
        num_q_heads: int,
        cap: int,
        max_q_rows: int,
        layers: list[int],
        device: torch.device,
    ):
        if not layers:
            raise ValueError("score capture needs at least one layer")
        self.layers = frozenset(layers)
        self.first_layer = min(layers)
        self.cap = cap
        self.mass = torch.zeros((num_kv_heads, cap), dtype=torch.float32, device=device)
        self.lse = torch.empty((max_q_rows, num_q_heads), dtype=torch.float32, device=device)

    def lse_buffer(self, num_rows: int, num_heads: int) -> torch.Tensor:
        if num_rows > self.lse.shape[0]:
            raise RuntimeError(f"verify batch of {num_rows} query rows exceeds the LSE buffer")
        return self.lse[:num_rows, :num_heads]

    def wants(self, layer_id: int) -> bool:
        return layer_id in self.layers

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
            self.mass,
            sm_scale,
            logit_cap=logit_cap,
            accumulate=layer_id != self.first_layer,
        )

    def rows(self, verify_lens: torch.Tensor, width: int) -> torch.Tensor:
        """Per-request mass [bs, width] (summed over KV heads and scored layers).

        Rows follow the verify batch order; positions >= verify_lens[b] hold garbage
        that the selection masks out. No host synchronisation.
        """
        lens = verify_lens.to(torch.int64)
        starts = torch.cumsum(lens, 0) - lens
        col = torch.arange(width, device=lens.device)
        flat = (starts[:, None] + col[None, :]).clamp(max=self.cap - 1)
        return self.mass[:, flat].sum(0)
