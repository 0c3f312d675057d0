"""The PILLAR entry in SGLang's speculative-algorithm registry.

``SpeculativeAlgorithm.register`` is SGLang's public plugin API; this module adds the
three methods a bare ``CustomSpecAlgo`` lacks but the scheduler calls unconditionally
(``need_topk``, ``carries_draft_hidden_states``, ``create_future_map``) and the
server-argument validation that runs in the launching process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from sglang_sparsespec.config import ALGORITHM_NAME, PillarConfig
from sglang_sparsespec.modes import SelectionPolicy
from sglang_sparsespec.sampling.target import SamplingBackend
from sglang_sparsespec.selection.dense_heads import dense_heads_gap
from sglang_sparsespec.selection.match_heads import auto_heads, match_heads_gap

from .contacts import attention_backends, dp_attention
from .serve_warmup import add_to_server_args
from .server_args_flags import with_flags
from .signatures import launch_refusal

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

DEFAULT_NUM_STEPS = 8
DEFAULT_MAX_RUNNING_REQUESTS = 256
SUPPORTED_ATTENTION_BACKENDS = ("triton", "flashinfer")
# PILLAR's verify and plain-decoding forwards hook this backend's extend kernel (triton_verify.py),
# so it must serve TARGET_VERIFY whatever the user's backend is.
VERIFY_ATTENTION_BACKEND = "triton"


class PillarSpecAlgo(CustomSpecAlgo):
    """Self-speculation: the target drafts for itself, so no draft model, no draft KV."""

    def need_topk(self) -> bool:
        # The relay carries only the bonus token; drafts are a topk=1 chain.
        return False

    def carries_draft_hidden_states(self) -> bool:
        return False

    def has_draft_kv(self) -> bool:
        # Draft KV lands in the target pool at the positions verify rewrites.
        return False

    def create_future_map(
        self,
        device,
        req_to_token_pool,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)


def is_pillar(algorithm: object) -> bool:
    return isinstance(algorithm, PillarSpecAlgo)


def serves_pillar(server_args) -> bool:
    """Whether ``server_args`` (ServerArgs, or any object with its ``speculative_algorithm``) serve PILLAR."""
    return (server_args.speculative_algorithm or "").upper() == ALGORITHM_NAME


def route_attention(sa: ServerArgs) -> str | None:
    """Route TARGET_VERIFY (and DECODE) to the Triton backend, prefill to the user's; None or why not.

    With --attention-backend flashinfer this sets --decode-attention-backend triton and
    --speculative-attention-mode decode: SGLang then builds a HybridAttnBackend whose
    ``_select_backend`` sends decode/idle and, in mode "decode", target-verify forwards to its
    decode (Triton) child and every extend (prefill) forward to its prefill (FlashInfer) child.
    """
    prefill, decode = attention_backends(sa)
    given = sorted({name for name in (prefill, decode) if name is not None})
    if not given or not set(given) <= set(SUPPORTED_ATTENTION_BACKENDS):
        return (
            f"supports --attention-backend {' or '.join(SUPPORTED_ATTENTION_BACKENDS)} only (FA3 is not supported: "
            f"its prebuilt kernel cannot be installed on the GPU machines PILLAR is tested on), "
            f"got {given or 'the default'}"
        )
    if decode != VERIFY_ATTENTION_BACKEND:
        if sa.decode_attention_backend is not None:
            return (
                "drafts and verifies through its Triton kernels; --decode-attention-backend must be triton, "
                f"got {decode}"
            )
        sa.prefill_attention_backend = prefill
        sa.decode_attention_backend = VERIFY_ATTENTION_BACKEND
    if prefill != VERIFY_ATTENTION_BACKEND:
        # SGLang's default mode "prefill" would send the verify to the prefill child.
        sa.speculative_attention_mode = "decode"
    return None


def unsupported_attention(model_config) -> str | None:
    """What in the model's attention PILLAR cannot draft or verify (None: plain causal MHA/GQA).

    Its sparse draft and split verify kernels assume full causal attention in every layer over a
    16-bit K/V of one head dim: no sliding windows, no latent (MLA) or linear attention layers.
    """
    from sglang.srt.configs.model_config import AttentionArch

    text = model_config.hf_text_config
    layer_types = set(getattr(text, "layer_types", None) or ())
    if model_config.attention_arch == AttentionArch.MLA:
        return "multi-head latent attention (MLA)"
    if model_config.linear_attn_registry_result is not None or layer_types & {"linear_attention", "mamba"}:
        return "hybrid linear-attention / state-space layers"
    sliding = getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True)
    if model_config.is_hybrid_swa or "sliding_attention" in layer_types or sliding:
        return "sliding-window attention layers"
    return None


def unsupported_sampling(sa: ServerArgs) -> str | None:
    """What in the server's sampling setup the verify cannot reproduce (None: it reproduces stock's law).

    The sampled verify computes the distribution of stock's flashinfer or pytorch sampler
    (``sampling/target.SamplingBackend``); any other backend (ascend, token_oracle, one registered with
    ``register_sampler_backend``) has a law of its own. ``--rl-on-policy-target`` makes stock sample a
    temperature-only batch from the bf16 log-softmax of bf16 logits / T and return those log-probabilities
    to match a trainer; the verify samples from the fp32 softmax, and SGLang's speculative log-probabilities
    are fp32 too. SGLang settles an unset backend only after this runs (deterministic inference, which the flag
    turns on, forces pytorch unless ascend was asked for).
    """
    target = getattr(sa, "rl_on_policy_target", None)
    if target is not None:
        return (
            f"does not support --rl-on-policy-target {target}: stock then samples and scores "
            "temperature-only batches from a bf16 log-softmax, PILLAR's verify from the fp32 softmax; serve on-policy "
            "rollouts without speculation"
        )
    supported = [b.value for b in SamplingBackend]
    # None: SGLang settles the default after this check (flashinfer where installed, else pytorch; pytorch
    # under deterministic inference), and PILLAR reproduces both.
    if sa.sampling_backend is not None and sa.sampling_backend not in supported:
        return (
            f"its verify reproduces the {' or '.join(supported)} sampler only; --sampling-backend "
            f"{sa.sampling_backend} is not supported"
        )
    return None


# Speculative-decoding flags of later releases that change how EAGLE drafts or accepts; PILLAR drafts
# and verifies with its own kernels and rejection sampling, so each is refused rather than ignored.
# (flag, its ServerArgs field, the value that leaves it off; releases without the field read it as off)
NEIGHBOUR_FLAGS: tuple[tuple[str, str, object], ...] = (
    ("--speculative-draft-window-size", "speculative_draft_window_size", None),
    ("--speculative-draft-sink-size", "speculative_draft_sink_size", None),  # 0.5.21
    ("--speculative-use-block-verification", "speculative_use_block_verification", False),  # 0.5.22
    ("--enable-watermark", "enable_watermark", False),  # 0.5.22: stock's verify watermarks, PILLAR's does not
    # A draft model's settings (PILLAR's drafter is the target itself, so none would apply). SGLang fills the draft
    # quantization and load format in from the target's itself, so those two are not listed.
    ("--speculative-draft-model-revision", "speculative_draft_model_revision", None),
    ("--speculative-token-map", "speculative_token_map", None),  # --pillar-draft-vocab is PILLAR's reduced vocabulary
    ("--speculative-draft-attention-backend", "speculative_draft_attention_backend", None),
    ("--speculative-adaptive-config", "speculative_adaptive_config", None),
    ("--enable-draft-weights-cpu-backup", "enable_draft_weights_cpu_backup", False),
)


# Flags whose set-up SGLang does in the model runner's own paths (ForwardBatch.init_new, the runner's forward and
# graph replays), which PILLAR's draft and plain steps do not take: decode context parallelism (per-rank KV slots and
# attention merges), MoE all-to-all dispatch (the per-replay dispatch mode), split prefill, two-batch overlap,
# routed-expert capture. (flag, field, off value), read as NEIGHBOUR_FLAGS are.
RUNNER_FLAGS: tuple[tuple[str, str, object], ...] = (
    ("--dcp-size", "dcp_size", 1),
    ("--moe-a2a-backend", "moe_a2a_backend", "none"),
    ("--moe-dense-tp-size", "moe_dense_tp_size", None),
    ("--enable-pdmux", "enable_pdmux", False),
    ("--enable-two-batch-overlap", "enable_two_batch_overlap", False),
    ("--enable-return-routed-experts", "enable_return_routed_experts", False),
)


# KV cache layouts other than SGLang's default one [slot, KV head, dim] tensor per layer, which PILLAR's draft, verify
# and score kernels index by slot (the page-major envelope's per-layer views are 4-D, a token's stride spanning every
# layer; the unified pool implies it): read with the default's strides they would attend to other tokens' K/V.
LAYOUT_FLAGS: tuple[tuple[str, str, object], ...] = (
    ("--enable-page-major-kv-layout", "enable_page_major_kv_layout", False),
    ("--enable-unified-memory", "enable_unified_memory", False),
)


# The --kv-cache-dtype values of an unscaled 16-bit cache ("auto": the model's dtype, unless its checkpoint asks for
# an fp8 cache, which the worker finds).
HALF_KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16", "fp16", "float16")


def first_set(flags: tuple[tuple[str, str, object], ...], sa: ServerArgs) -> str | None:
    """The first flag of ``flags`` (flag, field, off value) set in ``sa``; None when none is."""
    return next((flag for flag, field, off in flags if getattr(sa, field, off) not in (off, None)), None)


def unsupported_flag(sa: ServerArgs) -> str | None:
    """The first of ``NEIGHBOUR_FLAGS``, ``RUNNER_FLAGS`` and ``LAYOUT_FLAGS`` that is set, as one line; None when
    none is."""
    for flags, why in (
        (NEIGHBOUR_FLAGS, "drafts and verifies with its own kernels"),
        (RUNNER_FLAGS, "runs its draft and plain steps outside the model-runner paths that set it up"),
        (LAYOUT_FLAGS, "reads the KV cache as one [slot, head, dim] tensor per layer"),
    ):
        flag = first_set(flags, sa)
        if flag is not None:
            return f"{why}; {flag} is not supported"
    return None


def validate_server_args(sa: ServerArgs) -> None:
    """Reject what PILLAR cannot run and fill the spec shape fields SGLang reads.

    Runs in the launching process while SGLang resolves ServerArgs (in ``__post_init__``, from 0.5.19 in
    ``resolve_once``; from 0.5.20 on a stand-in whose writes SGLang declares as the resolved values);
    scheduler processes receive the already-validated, pickled ServerArgs.
    """

    def reject(msg: str) -> None:
        raise ValueError(f"--speculative-algorithm {ALGORITHM_NAME}: {msg}")

    refusal = launch_refusal()  # an SGLang release, or a build of one, the hooks were not checked against
    if refusal is not None:
        reject(refusal)
    if sa.page_size not in (None, 1):
        reject(f"needs --page-size 1 (token-granular KV for per-token sparse lists), got {sa.page_size}")
    routing_gap = route_attention(sa)
    if routing_gap is not None:
        reject(routing_gap)
    if sa.speculative_draft_model_path is not None:
        reject("drafts with the target model itself; remove --speculative-draft-model-path")
    if dp_attention(sa):
        reject(
            "does not support DP attention (--enable-dp-attention, from SGLang 0.5.22 --attn-dp-size): its "
            "attention ranks hold different batches, and every rank runs the round (draft count, dense requests) "
            "agreed from rank 0's batch; for more GPUs use --dp-size N alone (one PILLAR replica per --tp-size GPUs)"
        )
    if getattr(sa, "disaggregation_mode", "null") != "null":
        reject(
            f"does not support --disaggregation-mode {sa.disaggregation_mode}: a decode server receives requests "
            "prefilled on another server, and PILLAR builds each request's sparse draft plan at its own prefill; "
            "serve PILLAR without disaggregation (--dp-size N for more GPUs)"
        )
    if sa.pp_size != 1:
        reject(f"does not support pipeline parallelism (--pp-size {sa.pp_size})")
    if sa.speculative_eagle_topk not in (None, 1):
        reject(f"drafts a single chain; --speculative-eagle-topk must be 1, got {sa.speculative_eagle_topk}")
    if getattr(sa, "speculative_adaptive", False):
        reject("does not support --speculative-adaptive")
    if sa.speculative_accept_threshold_single != 1.0 or sa.speculative_accept_threshold_acc != 1.0:
        reject("is lossless; --speculative-accept-threshold-* must stay 1.0")
    if sa.kv_cache_dtype not in HALF_KV_CACHE_DTYPES:
        reject(
            f"needs a 16-bit KV cache (its Triton kernels read K/V unscaled), got --kv-cache-dtype {sa.kv_cache_dtype}"
        )
    if sa.enable_lora or sa.lora_paths:
        reject(
            "does not support LoRA (--enable-lora, --lora-paths): its draft steps run outside "
            "ForwardBatch.init_new, where SGLang prepares a batch's adapters"
        )
    if sa.enable_mixed_chunk:
        reject("cannot mix prefill chunks into decode batches; remove --enable-mixed-chunk")
    flag_gap = unsupported_flag(sa)
    if flag_gap is not None:
        reject(flag_gap)
    sampling_gap = unsupported_sampling(sa)
    if sampling_gap is not None:
        reject(sampling_gap)

    from sglang.srt.configs.model_config import ModelConfig

    from .triton_verify import signature_gap

    moved = signature_gap()
    if moved is not None:
        reject(f"its verify hook reads arguments the installed SGLang's extend kernel lacks ({moved})")

    # Built here, not through sa.get_model_config(), which would cache it on the ServerArgs
    # before __post_init__ has finished adjusting them.
    model_config = ModelConfig.from_server_args(sa)
    if not model_config.is_generation or model_config.is_encoder_decoder:
        reject("serves decoder-only generation models only (not embedding, reward or encoder-decoder models)")
    gap = unsupported_attention(model_config)
    if gap is not None:
        reject(f"cannot serve a model with {gap}: its draft and verify kernels need full causal attention")
    if model_config.dtype not in (torch.bfloat16, torch.float16):
        # Its kernels multiply bf16 / fp16 q and K/V; --kv-cache-dtype auto follows the model's dtype.
        reject(f"serves bf16 / fp16 models; this one runs in {model_config.dtype}: pass --dtype bfloat16")
    if model_config.model_is_mrope:
        reject(
            "cannot serve a model with multimodal rotary positions (mrope, Qwen-VL-style): "
            "its draft steps run without mrope_positions"
        )

    num_steps = DEFAULT_NUM_STEPS if sa.speculative_num_steps is None else sa.speculative_num_steps
    if sa.speculative_num_draft_tokens not in (None, num_steps + 1):
        reject(
            f"verifies k+1 tokens: --speculative-num-draft-tokens must be {num_steps + 1} "
            f"for --speculative-num-steps {num_steps}, got {sa.speculative_num_draft_tokens}"
        )
    try:  # fail here, in the launcher, on bad --pillar-* / SPARSESPEC_* values
        cfg = PillarConfig.from_env(num_steps)
    except ValueError as exc:
        reject(with_flags(str(exc)))
    if cfg.draft_vocab >= model_config.vocab_size:
        reject(
            f"--pillar-draft-vocab {cfg.draft_vocab} is not below the model's vocabulary ({model_config.vocab_size})"
        )
    if cfg.draft_vocab and sa.tp_size != 1:
        # Each rank holds a slice of the LM head by vocabulary, and the logits are gathered across ranks.
        reject(f"--pillar-draft-vocab runs on one GPU (--tp-size 1), got --tp-size {sa.tp_size}")
    if cfg.dense_heads and sa.tp_size != 1:
        # The listed heads are the model's KV head indices, which one rank holds all of.
        reject(f"--pillar-dense-heads runs on one GPU (--tp-size 1), got --tp-size {sa.tp_size}")
    num_layers, num_kv_heads = model_config.num_hidden_layers, model_config.get_total_num_kv_heads()
    gap = dense_heads_gap(cfg.dense_heads, num_layers, num_kv_heads)
    if gap is not None:
        reject(gap)
    if cfg.match_heads and (sa.tp_size != 1 or cfg.mixed or cfg.policy is SelectionPolicy.ORACLE):
        # One rank's heads, as for dense heads; mixed-phase forwards and the oracle's draft steps scan nothing.
        reject("--pillar-match-heads runs on one GPU (--tp-size 1) with split batch phases and a plan policy other "
               f"than oracle, got --tp-size {sa.tp_size}, {cfg.batch_phases.value}, {cfg.policy.value}")  # fmt: skip
    gap = match_heads_gap(cfg.match_heads, num_layers, num_kv_heads, cfg.dense_heads)
    if gap is not None:
        reject(gap)
    if auto_heads(cfg.match_heads) is not None and sa.skip_server_warmup:
        # The heads are named by probe requests the server's own warm-up sends (patches/probe_capture.py).
        reject(f"--pillar-match-heads {cfg.match_heads} needs the server's warm-up, which names the heads: drop "
               "--skip-server-warmup or name the heads (head_probe prints them)")  # fmt: skip
    if cfg.mixed and sa.tp_size != 1:
        # Its acceptance runs inside the forward's CUDA graph, without rank 0's broadcast of the tokens.
        reject(f"--pillar-batch-phases mixed runs on one GPU (--tp-size 1), got --tp-size {sa.tp_size}")
    sa.speculative_num_steps = num_steps
    sa.speculative_eagle_topk = 1
    sa.speculative_num_draft_tokens = num_steps + 1
    # Drafts are *sampled* from the sparse model's distribution, so the verify must use
    # exact rejection sampling with those draft probabilities to stay lossless.
    sa.speculative_use_rejection_sampling = True
    if sa.max_running_requests is None:
        # The draft runner's static buffers (tokens, draft records) are sized by this.
        sa.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
    # Before the server listens, every eager kernel variant of a round is built (patches/serve_warmup.py).
    add_to_server_args(sa)
