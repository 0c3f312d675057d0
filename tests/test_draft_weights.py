"""fp8 draft weights: which layers get copies, where the linear hook routes a call (only inside the draft
steps' context, only copied layers at decode batch sizes), what the routed call computes, and the knob.

The kernel runs in Triton's CPU interpreter here (see triton_env.py); the draft runner's graphs with the
route on are GPU tests (test_draft_runner.py).
"""

from __future__ import annotations

import pytest
import torch
from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod, UnquantizedLinearMethod
from sglang_sparsespec.config import DraftWeights, PillarConfig, knob_named
from sglang_sparsespec.patches.draft_weights import MAX_ROWS, FP8Weights, fp8_draft_linear, fp8_draft_lm_head
from triton_env import DEVICE


class _Linear(torch.nn.Module):
    """What the hook sees of an SGLang linear layer: a weight [N, K] and its quant_method."""

    def __init__(self, n: int, k: int, method=None, dtype=torch.bfloat16):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k, dtype=dtype, device=DEVICE) * 0.1, requires_grad=False)
        self.quant_method = method if method is not None else UnquantizedLinearMethod()


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = _Linear(48, 64)
        self.down = _Linear(64, 96)
        self.odd_k = _Linear(16, 50)  # no K tile divides 50: keeps its exact weights
        self.fp32 = _Linear(16, 64, dtype=torch.float32)  # not a bf16 / fp16 weight
        self.other = _Linear(16, 64, method=object())  # another quant method (a quantized layer)
        self.norm = torch.nn.LayerNorm(64)
        self.lm_head = _Linear(80, 64, method=UnquantizedEmbeddingMethod())
        self.embed = _Linear(80, 64, method=UnquantizedEmbeddingMethod())  # an embedding that is not the head


_SGLANG_CALLS: list[int] = []


def _exact(method, layer, x, bias=None):
    """Stands in for SGLang's method: the exact product; each call is counted so a test can tell the paths apart."""
    _SGLANG_CALLS.append(id(layer))
    out = x.float() @ layer.weight.float().T + (0 if bias is None else bias.float())
    return out.to(x.dtype)


def _assert_fp8_product(got: torch.Tensor, x: torch.Tensor, layer, bias=None) -> None:
    """``got`` is x @ w.T (+ bias) up to e4m3's rounding of each weight (2^-4 of its channel's scale, so of
    each term) and bf16's of the result: what the fp8 copy computes, not something else."""
    w = layer.weight.float()
    exact = x.float() @ w.T + (0 if bias is None else bias.float())
    bound = 0.0625 * (x.float().abs() @ w.abs().T) + 0.01 * exact.abs() + 1e-3
    assert ((got.float() - exact).abs() <= bound).all()


def _ran_sglang(fn) -> bool:
    before = len(_SGLANG_CALLS)
    fn()
    return len(_SGLANG_CALLS) > before


def test_copies_are_made_for_unquantized_half_precision_linear_layers_only() -> None:
    model = _Model()
    weights = FP8Weights.build(model, torch.device(DEVICE))
    assert set(weights.table) == {id(model.qkv), id(model.down), id(model.lm_head)}
    w8, scale = weights.table[id(model.down)]
    assert w8.dtype == torch.float8_e4m3fn and w8.shape == (64, 96) and scale.shape == (64,)
    assert weights.nbytes == 48 * 64 + 64 * 96 + 80 * 64 + (48 + 64 + 80) * 4
    with pytest.raises(ValueError, match="no unquantized"):
        FP8Weights.build(torch.nn.Sequential(torch.nn.LayerNorm(4)), torch.device(DEVICE))


def test_the_hook_routes_only_copied_layers_inside_the_draft_context() -> None:
    model = _Model()
    weights = FP8Weights.build(model, torch.device(DEVICE))
    method = model.qkv.quant_method
    x = torch.randn(5, 64, dtype=torch.bfloat16, device=DEVICE)
    bias = torch.randn(48, dtype=torch.bfloat16, device=DEVICE)
    # Outside the draft steps: SGLang's method.
    assert _ran_sglang(lambda: fp8_draft_linear(_exact, method, model.qkv, x))
    with weights.active():
        # The fp8 product, not SGLang's call: close to the exact product.
        assert not _ran_sglang(lambda: fp8_draft_linear(_exact, method, model.qkv, x, bias))
        routed = fp8_draft_linear(_exact, method, model.qkv, x, bias)
        _assert_fp8_product(routed, x, model.qkv, bias)
        # A layer without a copy, and a batch wider than decode batches: SGLang's method.
        assert _ran_sglang(lambda: fp8_draft_linear(_exact, method, model.odd_k, torch.randn(5, 50).to(x)))
        wide = torch.randn(MAX_ROWS + 1, 64, dtype=torch.bfloat16, device=DEVICE)
        assert _ran_sglang(lambda: fp8_draft_linear(_exact, method, model.qkv, wide))
        # Leading dims and a non-contiguous input are kept / handled.
        x3 = torch.randn(2, 3, 128, dtype=torch.bfloat16, device=DEVICE)[..., ::2]
        out3 = fp8_draft_linear(_exact, method, model.qkv, x3)
        assert out3.shape == (2, 3, 48)
        _assert_fp8_product(out3, x3, model.qkv)
    assert _ran_sglang(lambda: fp8_draft_linear(_exact, method, model.qkv, x))  # the context is left behind


def test_the_lm_head_hook_routes_the_copy_unless_sglang_keeps_its_own_path() -> None:
    from types import SimpleNamespace

    model = _Model()
    weights = FP8Weights.build(model, torch.device(DEVICE))
    calls: list[str] = []

    def original(processor, hidden, head, bias=None, **kwargs):
        calls.append("sglang")
        return hidden.float() @ head.weight.float().T

    plain = SimpleNamespace(use_fp32_lm_head=False)
    hidden = torch.randn(6, 64, dtype=torch.bfloat16, device=DEVICE)
    fp8_draft_lm_head(original, plain, hidden, model.lm_head)
    assert calls == ["sglang"]  # outside the draft steps
    with weights.active():
        logits = fp8_draft_lm_head(original, plain, hidden, model.lm_head, None, out=None)
        assert calls == ["sglang"] and logits.dtype == torch.bfloat16 and logits.shape == (6, 80)
        _assert_fp8_product(logits, hidden, model.lm_head)
        fp8_draft_lm_head(original, SimpleNamespace(use_fp32_lm_head=True), hidden, model.lm_head)
        fp8_draft_lm_head(original, SimpleNamespace(use_fp32_lm_head_output=True), hidden, model.lm_head)
        model.lm_head.set_lora = True  # a LoRA-wrapped head runs its own forward
        fp8_draft_lm_head(original, plain, hidden, model.lm_head)
    assert calls == ["sglang"] * 4


def test_the_knob_and_its_refusals() -> None:
    assert PillarConfig().draft_weights is DraftWeights.EXACT
    assert knob_named("DRAFT_WEIGHTS").parse("fp8") is DraftWeights.FP8
    with pytest.raises(ValueError):
        knob_named("DRAFT_WEIGHTS").parse("int4")
    with pytest.raises(ValueError, match="DRAFT_WEIGHTS=fp8 does not combine with .*BATCH_PHASES=mixed"):
        PillarConfig(draft_weights=DraftWeights.FP8, batch_phases=knob_named("BATCH_PHASES").parse("mixed"))


def test_the_draft_runner_reads_the_copies_in_draft_steps_only(monkeypatch) -> None:
    """Draft steps run inside the fp8 context; the plain-decoding step (a target decode step) does not."""
    from types import SimpleNamespace

    from sglang_sparsespec.patches import draft_runner as dr
    from sglang_sparsespec.patches import draft_weights as dw
    from test_draft_runner import V, FakeBackend, FakeModel, sampling

    from sglang_sparsespec.selection.state import PlanState

    class Model(FakeModel, torch.nn.Module):
        """The stand-in model of test_draft_runner with one linear layer; records whether each forward ran in
        the fp8 context."""

        def __init__(self) -> None:
            torch.nn.Module.__init__(self)
            FakeModel.__init__(self)
            self.proj = _Linear(32, 64)
            self.fp8_seen: list[bool] = []

        def forward(self, input_ids, positions, fb):
            self.fp8_seen.append(dw._ACTIVE.get() is not None)
            return FakeModel.forward(self, input_ids, positions, fb)

    monkeypatch.setattr(dr, "PillarDraftBackend", FakeBackend)
    req_to_token = torch.arange(8 * 64, dtype=torch.int32, device=DEVICE).view(8, 64) + 1000
    model = Model()
    mr = SimpleNamespace(
        device=DEVICE,
        model=model,
        model_config=SimpleNamespace(vocab_size=V),
        spec_algorithm=None,
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        server_args=SimpleNamespace(enable_cudagraph_gc=False),
    )
    state = PlanState.allocate(8, 2, 3, True, 16, torch.device(DEVICE))
    cfg = PillarConfig(num_steps=4, draft_candidates=4, draft_weights=DraftWeights.FP8)
    runner = dr.PillarDraftRunner(mr, cfg, state, max_bs=8, capture_bs=[], plain_decode=True)
    assert set(runner.fp8_weights.table) == {id(model.proj)}
    rpi, seq_lens, bonus = (torch.tensor(v, device=DEVICE) for v in ([5, 1, 6], [10, 3, 20], [7, 8, 9]))
    runner.run(rpi, seq_lens, bonus, sampling(True), 3)
    runner.decode_logits(rpi, seq_lens + 3, bonus)
    assert model.fp8_seen == [True, True, True, False]


def test_running_out_of_memory_for_the_copies_is_one_clear_error(monkeypatch) -> None:
    from sglang_sparsespec.patches import draft_weights as dw

    def no_memory(w):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(dw, "quantize_rows", no_memory)
    with pytest.raises(ValueError, match="no GPU memory left for the fp8 copies.*--mem-fraction-static"):
        FP8Weights.build(_Model(), torch.device(DEVICE))


def test_sglang_calls_reach_the_routes_through_the_loaded_plugin() -> None:
    """Through SGLang's plugin loading (the hooks as a server applies them): SGLang's own
    UnquantizedLinearMethod.apply runs the fp8 copy inside the draft context, its exact product outside."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    assert hasattr(UnquantizedLinearMethod.apply, "__wrapped__")
    model = _Model()
    weights = FP8Weights.build(model, torch.device(DEVICE))
    method = model.qkv.quant_method
    x = torch.randn(4, 64, dtype=torch.bfloat16, device=DEVICE)
    exact = method.apply(model.qkv, x)
    torch.testing.assert_close(exact.float(), x.float() @ model.qkv.weight.float().T, rtol=1e-2, atol=1e-2)
    with weights.active():
        routed = method.apply(model.qkv, x)
    assert not torch.equal(routed, exact)
    _assert_fp8_product(routed, x, model.qkv)
