"""Dummy verify inputs for CUDA-graph capture and warm-up, and the verify prologue's scope in captures.

``DecodeCudaGraphRunner.get_spec_info`` and ``spec_info.create_dummy_verify_input``
return ``None`` for plugin algorithms, so the target's TARGET_VERIFY graph would be
captured without spec metadata (no hidden-state capture, no tree mask). PILLAR verifies
exactly like EAGLE with topk=1, so it gets EAGLE's dummy, at the width of the graph being
captured (the worker captures a width-1 graph for plain-decoding rounds besides the k+1 one).

A TARGET_VERIFY capture runs inside ``triton_verify.verify_qk_scope``, so the verify prologue's launch, not
SGLang's q/k norm and rotary kernels, is recorded where the backend's hooks ask for it.
"""

from __future__ import annotations

import torch

from .contacts import arguments
from .spec_algo import is_pillar
from .triton_verify import verify_qk_scope


def _eagle_style_dummy(spec_steps: int, draft_token_num: int, custom_mask):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    return EagleVerifyInput(
        draft_token=None,
        custom_mask=custom_mask,
        positions=None,
        retrieve_index=None,
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        retrieve_cum_len=None,
        spec_steps=spec_steps,
        topk=1,
        draft_token_num=draft_token_num,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=None,
        seq_lens_cpu=None,
    )


def graph_runner_spec_info(original, runner, num_tokens: int):
    """AROUND ``DecodeCudaGraphRunner.get_spec_info(self, num_tokens)``."""
    mr = runner.model_runner
    if not is_pillar(mr.spec_algorithm) or mr.is_draft_worker:
        return original(runner, num_tokens)
    spec_info = _eagle_style_dummy(
        runner.speculative_num_steps, runner.speculative_num_draft_tokens, runner.buffers.custom_mask
    )
    spec_info.hidden_states = torch.zeros((num_tokens, mr.model_config.hidden_size), dtype=mr.dtype, device=mr.device)
    return spec_info


def warmup_dummy_verify_input(original, *args, **kwargs):
    """AROUND ``spec_info.create_dummy_verify_input`` (used by runner warm-up; 0.5.18 dropped its
    server_args parameter, so its arguments are read by name)."""
    call = arguments(original, args, kwargs)
    if not is_pillar(call["spec_algorithm"]) or call["is_draft_worker"]:
        return original(*args, **kwargs)
    n = call["num_tokens_per_req"]
    return _eagle_style_dummy(n - 1, n, call["custom_mask"])


def verify_capture_scope(original, runner):
    """AROUND ``DecodeCudaGraphRunner.capture(self)``: a TARGET_VERIFY capture on a backend whose verify prologue
    takes over the model's q/k norm and rotary records the model's forwards with those calls left to it."""
    with verify_qk_scope(runner.attn_backend, runner.capture_forward_mode):
        return original(runner)
