"""``PillarVerifyInput``: a round's verify input, which owns its acceptance as SGLang's
``EagleVerifyInput`` does.

It is EAGLE's topk=1 chain verify input (``chain``: SGLang's ``build_eagle_verify_input``; ``plain``:
the one-token input of a plain round, as SGLang builds it for EAGLE's zero-step rounds) with the
round's draft record and each request's own draft count. ``accept`` decides the round from the verify
logits: the same logit processing as SGLang's ``eagle_sample`` (NaN guard, penalties, logit bias,
grammar mask), then

* sampled batches: exact rejection sampling of the draft record against the distribution stock
  decoding samples from under the server's sampling backend (``sampling/accept.stock_accept``;
  SGLang's sampled verify would need every draft's full-vocabulary distribution);
* greedy batches whose requests draft different counts, or with a custom logit processor (applied
  last, as SGLang's Sampler does, to row 0 of each request: such requests draft nothing,
  ``request_rounds``): the greedy chain rule with each request's count (``greedy_accept``), since
  SGLang's greedy verify would accept drafts of a request that has none;
* other greedy batches and idle batches: SGLang's ``eagle_sample`` itself.

With ``--pillar-verify-logits half`` the logits arrive in the LM head's dtype (``draft_logits``); only a
sampled batch whose logits nothing but ``stock_accept`` reads keeps them so, every other batch gets SGLang's
fp32 values first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.eagle_info import EagleVerifyInput
from sglang.srt.speculative.eagle_utils import _verify_coins, eagle_sample

from sglang_sparsespec.sampling.accept import chain_layout, greedy_accept, stock_accept
from sglang_sparsespec.sampling.rejection import DraftRecord
from sglang_sparsespec.sampling.target import SamplingBackend, SamplingRows


def sampling_backend() -> SamplingBackend:
    """The stock sampler this server runs (``--sampling-backend``; deterministic inference forces
    pytorch), read where SGLang's Sampler reads it."""
    from sglang.srt.runtime_context import get_exec

    return SamplingBackend(get_exec().kernel.sampling_backend)


def sampling_rows(sampling_info) -> SamplingRows:
    """A batch's parameters as SGLang lays them out (temperatures [bs, 1]; off filters TOP_K_ALL /
    1.0; greedy requests top_k 1 at temperature 1; min_ps only when a request uses min-p)."""
    min_p = sampling_info.min_ps if sampling_info.need_min_p_sampling else None
    return SamplingRows(
        sampling_info.temperatures.view(-1), sampling_info.top_ps, sampling_info.top_ks, min_p, sampling_backend()
    )


@dataclass
class PillarVerifyInput(EagleVerifyInput):
    """``EagleVerifyInput`` fields as SGLang builds them, and:

    record: the round's drafts with their compact proposal rows (``DraftRecord``: tokens [bs, k],
        cand_ids / cand_q [bs, k, C], q_tok [bs, k]); a zero-width record for a sampled plain round;
        None when the batch drafted greedily (no distributions to reject against);
    num_drafts: [bs] int32 on the device, each request's own draft count where some requests draft
        fewer than the round (per-token sampling state: ``request_rounds``); None when every request
        drafted the whole round.
    """

    record: DraftRecord | None = None
    num_drafts: torch.Tensor | None = None

    @classmethod
    def extend(
        cls, chain: EagleVerifyInput, record: DraftRecord | None, num_drafts: torch.Tensor | None = None
    ) -> PillarVerifyInput:
        """``chain``'s fields unchanged, with PILLAR's round attached."""
        base = {f.name: getattr(chain, f.name) for f in fields(EagleVerifyInput) if f.init}
        return cls(**base, record=record, num_drafts=num_drafts)

    @classmethod
    def plain(cls, batch, attn_backend, record: DraftRecord | None, device: str) -> PillarVerifyInput:
        """A one-token verify rooted at each request's pending (bonus) token, as SGLang's EAGLE worker
        builds it for its zero-step rounds, on ``attn_backend`` (whose verify mask it fills)."""
        if batch.forward_mode.is_idle():
            idle = EagleVerifyInput.create_idle_input(topk=1, spec_steps=0, num_verify_tokens=1, device=device)
            return cls.extend(idle, record)
        bs = batch.seq_lens.shape[0]
        verify_mask = attn_backend.verify_mask
        # Every position of a one-node tree is visible, so an all-True mask serves either layout.
        if verify_mask is not None and verify_mask.fits(bs):
            custom_mask = verify_mask.buffer
            custom_mask.fill_(True)
        else:
            if batch.seq_lens_sum is not None:
                seq_lens_sum = batch.seq_lens_sum
            elif batch.seq_lens_cpu is not None:
                seq_lens_sum = int(batch.seq_lens_cpu.sum())
            else:
                seq_lens_sum = bs * attn_backend.max_context_len
            custom_mask = torch.ones(seq_lens_sum + bs, dtype=torch.bool, device=device)
        return cls(
            draft_token=batch.spec_info.bonus_tokens,
            custom_mask=custom_mask,
            positions=batch.seq_lens.to(torch.int64),
            retrieve_index=torch.arange(bs, dtype=torch.long, device=device).unsqueeze(1),
            retrieve_next_token=torch.full((bs, 1), -1, dtype=torch.long, device=device),
            retrieve_next_sibling=torch.full((bs, 1), -1, dtype=torch.long, device=device),
            retrieve_cum_len=None,
            spec_steps=0,
            topk=1,
            draft_token_num=1,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=None,
            seq_lens_cpu=None,
            record=record,
        )

    def accept(self, batch, logits_output, grammar_mask=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The round's acceptance from the verify logits (module docstring), in SGLang's layout:
        (predict [bs * (k + 1)] int32, accept_lens [bs] int32 with the emitted token, accept_index
        [bs, k + 1] int32: the accepted rows, then -1)."""
        sampling_info = batch.sampling_info
        record, num_drafts = self.record, self.num_drafts
        if batch.forward_mode.is_idle() or not _reads_kept_logits(batch, record, grammar_mask):
            _widen(logits_output)
        if batch.forward_mode.is_idle():
            return eagle_sample(self, batch, logits_output, grammar_mask)
        greedy = sampling_info.is_all_greedy
        per_request = num_drafts is not None or sampling_info.has_custom_logit_processor
        if (greedy and not per_request) or (not greedy and record is None):
            return eagle_sample(self, batch, logits_output, grammar_mask)
        logits = logits_output.next_token_logits
        self._process_logits(logits, sampling_info, grammar_mask)
        bs, k1 = batch.seq_lens.shape[0], self.draft_token_num
        candidates = self.draft_token.reshape(bs, k1)
        if greedy:
            if num_drafts is None:  # every request drafted the whole verify width
                num_drafts = torch.full((bs,), k1 - 1, dtype=torch.int32, device=logits.device)
            emitted, num_accepted = greedy_accept(logits.argmax(dim=-1).view(bs, k1), candidates[:, 1:], num_drafts)
        else:
            if num_drafts is not None:
                record = dataclasses.replace(record, num_drafts=num_drafts)
            coins, final_coins = _verify_coins(
                sampling_info=sampling_info,
                seq_lens=batch.seq_lens,
                draft_token_num=k1,
                candidates=candidates,
                device=logits.device,
            )
            rows = sampling_rows(sampling_info)
            emitted, num_accepted = stock_accept(logits, rows, record, coins[:, : k1 - 1], final_coins)
        predict, accept_lens, accept_index = chain_layout(emitted, num_accepted, self.retrieve_index)
        _broadcast_from_rank0(predict, accept_index, accept_lens)
        return predict, accept_lens, accept_index

    def _process_logits(self, logits: torch.Tensor, sampling_info, grammar_mask) -> None:
        """In place, what eagle_sample does to the verify logits before sampling."""
        from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties
        from sglang.srt.utils.async_probe import sanitize_nan_logits

        n = self.draft_token_num
        sanitize_nan_logits(logits, "verify: target model logits")
        if sampling_info.acc_additive_penalties is not None:
            logits.add_(torch.repeat_interleave(sampling_info.acc_additive_penalties, n, dim=0))
        if sampling_info.acc_scaling_penalties is not None:
            apply_scaling_penalties(logits, torch.repeat_interleave(sampling_info.acc_scaling_penalties, n, dim=0))
        if sampling_info.logit_bias is not None:
            logits.add_(torch.repeat_interleave(sampling_info.logit_bias, n, dim=0))
        if grammar_mask is not None:
            grammar_mask.apply(logits)
        if sampling_info.has_custom_logit_processor:
            # Stock applies processors after the penalties, bias and grammar mask (ModelRunner.sample, then
            # Sampler._preprocess_logits), once per request: here to row 0, the row of the token such a
            # request takes (it drafts nothing), a view written in place. NaNs a processor leaves are
            # cleaned after it, as in stock.
            from sglang.srt.layers.sampler import apply_custom_logit_processor

            row0 = logits.view(-1, n, logits.shape[-1])[:, 0]
            apply_custom_logit_processor(row0, sampling_info)
            sanitize_nan_logits(logits, "verify: custom logit processor")


def _reads_kept_logits(batch, record: DraftRecord | None, grammar_mask) -> bool:
    """Whether only ``stock_accept`` reads this verify's logits, which it widens to fp32 as it loads them
    (``--pillar-verify-logits half``): a sampled batch with a draft record, and nothing that adds to the
    logits in their own dtype (penalties, logit bias), masks them (grammars), runs code on them (custom
    processors) or reads them after the acceptance (logprobs)."""
    info = batch.sampling_info
    return (
        record is not None
        and not info.is_all_greedy
        and grammar_mask is None
        and not batch.return_logprob
        and info.acc_additive_penalties is None
        and info.acc_scaling_penalties is None
        and info.logit_bias is None
        and not info.has_custom_logit_processor
    )


def _widen(logits_output) -> None:
    # SGLang's own values: its logits processor copies the LM head's output to fp32 (exact for bf16 / fp16).
    logits = logits_output.next_token_logits
    if logits is not None and logits.dtype != torch.float32:
        logits_output.next_token_logits = logits.float()


def _broadcast_from_rank0(*tensors: torch.Tensor) -> None:
    # As SGLang's verify: ranks may round the target probabilities differently; rank 0 decides.
    from sglang.srt.distributed import get_tp_group
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.runtime_context import get_parallel

    group = get_parallel().attn_tp_group if is_dp_attention_enabled() else get_tp_group()
    if group.world_size > 1:
        for t in tensors:
            group.broadcast(t, src=0)
