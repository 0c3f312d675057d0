"""The launch check: the installed SGLang's signatures against the ones recorded for its release.

``signature_table.json`` holds, per supported release, the parameter list of every SGLang symbol
the plugin hooks (``HOOKS``) or calls, overrides or builds on by signature (``CALLED``), surveyed from
the released wheels (``python -m tools.survey_signatures``). At launch, the installed SGLang must be one
of those releases and match its row exactly: a hook or an adapter (``contacts.py``) was written
against that list, and a symbol whose parameters moved would be called wrong at serving time.
"""

from __future__ import annotations

import inspect
import json
import pkgutil
from pathlib import Path
from typing import Any

from . import versions
from .versions import out_of_range, release

# {symbol: {first release of a parameter list: that list, or None from a release that lacks the symbol}}
SIGNATURES: dict[str, dict[str, str | None]] = json.loads(
    (Path(__file__).with_name("signature_table.json")).read_text()
)["signatures"]

# SGLang functions and methods the plugin calls, overrides or subclasses by signature, and the dataclasses
# it builds (by their fields), besides the hooked targets (which the survey reads from the hook lists).
CALLED: tuple[str, ...] = (
    "sglang.kernels.ops.attention.decode_attention.decode_attention_fwd",
    "sglang.kernels.ops.attention.extend_attention.extend_attention_fwd",
    "sglang.kernels.ops.attention.kv_indices.create_flashinfer_kv_indices_triton",
    "sglang.kernels.ops.kvcache.kv_indices.create_flashinfer_kv_indices_triton",
    "sglang.kernels.ops.memory.common.write_req_to_token_pool_triton",
    "sglang.kernels.ops.sampling.murmur_hash.murmur_hash32",
    "sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_uniform",
    "sglang.kernels.ops.speculative.eagle.fill_bonus_tokens",
    "sglang.srt.arg_groups.model_override_base.attention_backends_of",
    "sglang.srt.arg_groups.model_override_base.resolved_view",
    "sglang.srt.configs.model_config.ModelConfig.from_server_args",
    "sglang.srt.distributed.parallel_state.graph_capture",
    "sglang.srt.layers.attention.base_attn_backend.AttentionBackend.update_verify_buffers_to_fill_after_draft",
    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__",
    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.get_num_kv_splits",
    "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata",
    "sglang.srt.layers.dp_attention.set_dp_buffer_len",
    "sglang.srt.layers.dual_gemm.DualGemm.can_run",
    "sglang.srt.layers.dp_attention.set_is_extend_in_batch",
    "sglang.srt.layers.logits_processor.LogitsProcessorOutput",
    "sglang.srt.layers.logprob_processor.compute_spec_logprobs",
    "sglang.srt.layers.logprob_processor.compute_spec_v2_logprobs",
    "sglang.srt.layers.sampler.Sampler.forward",
    "sglang.srt.layers.sampler.apply_custom_logit_processor",
    "sglang.srt.managers.io_struct.msgpack_decode",
    "sglang.srt.managers.io_struct.msgpack_encode",
    "sglang.srt.managers.overlap_utils.FutureMap.__init__",
    "sglang.srt.managers.schedule_batch.retract_all",
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
    "sglang.srt.managers.utils.GenerationBatchResult",
    "sglang.srt.mem_cache.common.evict_from_tree_cache",
    "sglang.srt.mem_cache.pool_host.mha.get_mha_host_pool_cls",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch.mark_forward_metadata_ready",
    "sglang.srt.model_executor.runner.base_cuda_graph_runner.freeze_gc",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.__init__",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.execute",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.load_batch",
    "sglang.srt.model_executor.runner.get_batch_sizes_to_capture",
    "sglang.srt.runtime_context.RuntimeContext.override",
    "sglang.srt.sampling.penaltylib.repetition_penalty.apply_scaling_penalties",
    "sglang.srt.server_args.ServerArgs.get_attention_backends",
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.alloc_memory_pool",
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.clear_cache_pool",
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.init_attention_backends",
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.init_cuda_graphs",
    "sglang.srt.speculative.base_spec_worker.BaseSpecWorker.on_verify_complete_cpu",
    "sglang.srt.speculative.eagle_info.EagleVerifyInput",
    "sglang.srt.speculative.eagle_utils._verify_coins",
    "sglang.srt.speculative.eagle_utils.default_tree_mask_mode",
    "sglang.srt.speculative.eagle_utils.eagle_sample",
    "sglang.srt.speculative.eagle_worker_common.build_eagle_verify_input",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__",  # the keywords the scheduler builds a worker with
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",  # and calls it with
    "sglang.srt.speculative.spec_registry.register_algorithm",
    "sglang.srt.speculative.spec_utils.GrammarTree.from_device",
    "sglang.srt.speculative.spec_utils.build_grammar_vocab_mask",
    "sglang.srt.speculative.spec_utils.get_plan_stream",
    "sglang.srt.speculative.spec_utils.record_stream_each",
    "sglang.srt.speculative.spec_utils.record_stream_for_v2_verify",
    "sglang.srt.utils.async_probe.maybe_detect_inf",
    "sglang.srt.utils.async_probe.maybe_detect_nan",
    "sglang.srt.utils.async_probe.maybe_detect_oob",
    "sglang.srt.utils.async_probe.sanitize_nan_logits",
)


def recorded(symbol: str, version: str | None = None) -> str | None:
    """``symbol``'s parameter list in SGLang ``version`` (default: installed) as surveyed; None where absent."""
    row = SIGNATURES[symbol]
    known = [v for v in row if release(v) <= release(version or versions.INSTALLED)]
    return row[max(known, key=release)] if known else None


def _unwrap(obj: Any) -> Any:
    """The Python function behind a hook wrapper, a classmethod or staticmethod, a Triton kernel."""
    while True:
        if isinstance(obj, (classmethod, staticmethod)):
            obj = obj.__func__
        elif hasattr(obj, "__wrapped__"):  # HookRegistry's wrappers, functools.wraps
            obj = obj.__wrapped__
        elif not inspect.isroutine(obj) and hasattr(obj, "fn"):  # triton.JITFunction, Autotuner
            obj = obj.fn
        else:
            return obj


def installed_signature(symbol: str) -> str | None:
    """``symbol``'s parameter list in the installed SGLang, formatted as the survey formats it."""
    owner_path, _, attr = symbol.rpartition(".")
    try:
        owner = pkgutil.resolve_name(owner_path)
    except (ImportError, AttributeError):
        return None
    raw = inspect.getattr_static(owner, attr, None)
    if raw is None:
        return None
    if isinstance(raw, type):  # a dataclass the plugin builds: its constructor's fields
        sig = inspect.signature(raw)
        return str(sig.replace(parameters=[p.replace(annotation=p.empty, default=p.empty)
                                           for p in sig.parameters.values()], return_annotation=sig.empty))  # fmt: skip
    sig = inspect.signature(_unwrap(raw), follow_wrapped=False)
    bare = [p.replace(annotation=p.empty, default=p.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=bare, return_annotation=sig.empty))


def signature_drift(version: str | None = None) -> list[str]:
    """Every recorded symbol of ``version`` whose installed parameters differ, as ``name (a, b) != (a, c)``."""
    drift = []
    for symbol in SIGNATURES:
        expected = recorded(symbol, version)
        if expected is not None and (found := installed_signature(symbol)) != expected:
            drift.append(f"{symbol} {found or 'absent'} != {expected}")
    return drift


def launch_refusal(version: str | None = None) -> str | None:
    """None when the installed SGLang is a supported release with its recorded signatures; else one line."""
    version = version or versions.INSTALLED
    if (refusal := out_of_range(version)) is not None:
        return refusal
    drift = signature_drift(version)
    if not drift:
        return None
    more = f" (and {len(drift) - 1} more)" if len(drift) > 1 else ""
    return (
        f"the installed SGLang differs from the released {version} the plugin was checked against: "
        f"{drift[0]}{more}; reinstall sglang=={version}"
    )
