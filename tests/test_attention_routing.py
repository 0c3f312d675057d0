"""PILLAR with --attention-backend flashinfer: prefill on FlashInfer, verify on the Triton backend.

spec_algo.route_attention makes SGLang build its HybridAttnBackend; triton_verify.verify_backend
must find the Triton child inside it the way SGLang routes TARGET_VERIFY forwards. The hybrid is
SGLang's real class, built around stand-in children (real FlashInfer/Triton backends need a GPU), for
ServerArgs resolved and published as a launch does (the hybrid reads its mode from the model runner's
ServerArgs up to 0.5.18, from the published configuration after).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
from sglang.srt import runtime_context
from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs
from sglang_sparsespec.patches.contacts import resolve
from sglang_sparsespec.patches.triton_verify import (
    VerifyHooks,
    attach_verify,
    attached_hooks,
    new_verify_backend,
    verify_backend,
)


class _Triton(TritonAttnBackend):
    # The real class (verify_backend checks it) without the model runner its __init__ reads.
    def __init__(self):
        self.needs_cpu_seq_lens = False
        self.extend_attention_fwd = extend_attention_fwd


class _FlashInfer:
    needs_cpu_seq_lens = True


@pytest.fixture
def model_dir(llama_config_dir):
    load_plugins()
    yield llama_config_dir
    runtime_context.reset_context()


def _runner(model_dir, backend: str, pillar: bool = True) -> SimpleNamespace:
    """A model runner of a server launched with ``--attention-backend backend`` (and PILLAR, or no
    speculation): its ServerArgs resolved and published, as every scheduler process has them."""
    spec = {"speculative_algorithm": "PILLAR"} if pillar else {}
    sa = resolve(ServerArgs(model_path=str(model_dir), attention_backend=backend, skip_tokenizer_init=True,
                            device="cpu", **spec))  # fmt: skip
    runtime_context.publish(sa, role="test")
    return SimpleNamespace(
        kv_cache_dtype=None,
        token_to_kv_pool=None,
        req_to_token_pool=None,
        kv_index_translator=None,
        model_config=SimpleNamespace(context_len=4096),
        server_args=sa,
    )


def _hybrid(model_dir, pillar: bool = True) -> tuple[HybridAttnBackend, _Triton, _FlashInfer]:
    """The hybrid of --attention-backend flashinfer: PILLAR routes the verify to its decode child
    (mode "decode"), stock speculation leaves SGLang's default mode "prefill"."""
    triton, flashinfer = _Triton(), _FlashInfer()
    runner = _runner(model_dir, "flashinfer", pillar)
    return HybridAttnBackend(runner, prefill_backend=flashinfer, decode_backend=triton), triton, flashinfer


def test_verify_and_decode_go_to_triton_and_prefill_to_flashinfer_in_decode_mode(model_dir):
    hybrid, triton, flashinfer = _hybrid(model_dir)
    assert verify_backend(hybrid) is triton
    assert hybrid._select_backend(ForwardMode.DECODE) is triton
    assert hybrid._select_backend(ForwardMode.EXTEND) is flashinfer
    # FlashInfer's host-side plan would otherwise force a seq_lens D2H every round.
    assert hybrid.needs_cpu_seq_lens is False


def test_attach_verify_marks_the_triton_child_only(model_dir):
    hybrid, triton, flashinfer = _hybrid(model_dir)
    hooks = VerifyHooks(None, split_kernel=True)
    attach_verify(hybrid, hooks)
    assert attached_hooks(triton) is hooks and triton.extend_attention_fwd is not extend_attention_fwd
    assert attached_hooks(hybrid) is None and attached_hooks(flashinfer) is None


def test_plain_triton_backend_is_its_own_verify_backend():
    triton = _Triton()
    assert verify_backend(triton) is triton


def test_verify_routed_to_flashinfer_is_refused(model_dir):
    # SGLang's default mode "prefill" would verify on FlashInfer, where no PILLAR kernel runs.
    hybrid, _, _ = _hybrid(model_dir, pillar=False)
    with pytest.raises(TypeError, match="Triton attention backend, got _FlashInfer"):
        verify_backend(hybrid)


def test_plain_decoding_backend_under_flashinfer_is_triton_only(model_dir, monkeypatch):
    built, runner = [], _runner(model_dir, "flashinfer")
    monkeypatch.setattr(
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend", lambda mr: built.append(mr) or "triton"
    )
    runner._get_attention_backend = lambda **_: pytest.fail("would build a second FlashInfer backend")
    assert new_verify_backend(runner) == "triton" and built == [runner]


def test_plain_decoding_backend_under_triton_is_sglangs_with_a_new_workspace(model_dir):
    runner = _runner(model_dir, "triton")
    runner.init_new_workspace = False

    def build(init_new_workspace: bool):
        runner.init_new_workspace = init_new_workspace
        return ("backend", init_new_workspace)

    runner._get_attention_backend = build
    assert new_verify_backend(runner) == ("backend", True)
    assert runner.init_new_workspace is False
