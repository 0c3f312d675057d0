"""patches/contacts.py: each adapter on the releases it spans.

Two kinds of check per adapter. Against the installed SGLang, for real (the suite's 0.5.17 pass runs
the 0.5.17 branch, its 0.5.23 pass the other). Against every supported release, through the signature
table surveyed from the wheels: the release an adapter switches at is where the recorded parameters
change, and the adapter called as of a release (``versions.INSTALLED`` set to it) fits a stand-in with
exactly that release's recorded parameter list.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()

from sglang_sparsespec.patches import HOOKS, contacts, versions  # noqa: E402
from sglang_sparsespec.patches.signatures import recorded  # noqa: E402
from sglang_sparsespec.patches.versions import SUPPORTED, for_release, since  # noqa: E402

ENDS = (SUPPORTED[0], SUPPORTED[-1])
VIEWS = "sglang.srt.arg_groups.model_override_base"  # the resolved views' module, from 0.5.19


def stand_in(symbol: str, release: str):
    """A function with ``symbol``'s recorded parameter list in ``release`` that returns its arguments (the
    table keeps names, not defaults: every named parameter defaults to None, so only a name the release
    lacks, or an argument in the wrong place, fails)."""
    params = recorded(symbol, release)
    assert params is not None, (symbol, release)
    names = params.strip("()").split(", ") if params != "()" else []
    defaulted = ", ".join(n if n in ("*", "/") or n.startswith("*") else f"{n}=None" for n in names)
    scope: dict = {}
    exec(f"def {symbol.rpartition('.')[2]}({defaulted}):\n    return dict(locals())", scope)  # noqa: S102
    return scope[symbol.rpartition(".")[2]]


@pytest.fixture(params=ENDS)
def release(request, monkeypatch) -> str:
    """The adapters called as of each end of the range."""
    monkeypatch.setattr(versions, "INSTALLED", request.param)
    return request.param


def changes_at(symbol: str, parameter: str) -> list[str]:
    """The supported releases whose recorded ``symbol`` takes ``parameter``."""
    return [r for r in SUPPORTED if parameter in (recorded(symbol, r) or "")]


# ---- create_flashinfer_kv_indices_triton --------------------------------------------------------------
def test_the_kv_indices_kernel_is_imported_from_where_each_release_has_it():
    for r in SUPPORTED:
        module = for_release(contacts.KV_INDICES_MODULES, r)
        assert recorded(f"{module}.create_flashinfer_kv_indices_triton", r) is not None, r
    installed = importlib.import_module(for_release(contacts.KV_INDICES_MODULES))
    assert contacts.create_flashinfer_kv_indices_triton is installed.create_flashinfer_kv_indices_triton


def test_the_kv_indices_kernel_gathers_as_the_draft_pass_calls_it():
    import torch
    from triton_env import DEVICE

    req_to_token = torch.arange(40, dtype=torch.int32, device=DEVICE).view(4, 10)
    pool = torch.tensor([2, 0], dtype=torch.int64, device=DEVICE)
    lens = torch.tensor([3, 2], dtype=torch.int32, device=DEVICE)
    indptr = torch.tensor([0, 3, 5], dtype=torch.int32, device=DEVICE)
    out = torch.zeros(5, dtype=torch.int32, device=DEVICE)
    contacts.create_flashinfer_kv_indices_triton[(2,)](req_to_token, pool, lens, indptr, None, out, 10)
    assert out.tolist() == [20, 21, 22, 0, 1]


# ---- ServerArgs: resolution, resolved values, attention backends ----------------------------------------
def test_resolution_moves_to_resolve_once_where_the_validation_hooks_follow_it():
    assert [r for r in SUPPORTED if recorded("sglang.srt.server_args.ServerArgs.resolve_once", r)] == [
        r for r in SUPPORTED if since("0.5.19", r)
    ]
    validators = {}
    for hook in HOOKS:
        if hook.target.rpartition(".")[2] in ("__post_init__", "resolve_once"):
            validators.setdefault(hook.fn, []).extend((r, hook.target) for r in hook.versions)
    assert len(validators) == 2  # the request caps and the offload flag
    for entries in validators.values():  # each applied once per release, on the entry point resolving there
        assert sorted(r for r, _ in entries) == sorted(SUPPORTED)
        assert all(t.endswith("resolve_once") == since("0.5.19", r) for r, t in entries)


def test_resolve_and_resolved_as_of_each_end(release, monkeypatch):
    calls = []
    sa = SimpleNamespace(resolve_once=lambda: calls.append("resolve_once"), page_size=None, _resolved_overrides=[])
    assert contacts.resolve(sa) is sa
    assert calls == (["resolve_once"] if release != SUPPORTED[0] else [])
    if release == SUPPORTED[0]:
        assert contacts.resolved(sa) is sa
    elif importlib.util.find_spec(VIEWS) is not None:  # the view needs that release's SGLang
        sa._resolved_overrides.append(("handler", {"page_size": 1}))
        assert contacts.resolved(sa).page_size == 1 and sa.page_size is None


def test_attention_backends_moved_off_server_args_in_0_5_19(release):
    moved = [r for r in SUPPORTED if recorded("sglang.srt.arg_groups.model_override_base.attention_backends_of", r)]
    kept = [r for r in SUPPORTED if recorded("sglang.srt.server_args.ServerArgs.get_attention_backends", r)]
    assert moved == [r for r in SUPPORTED if since("0.5.19", r)] and kept == [r for r in SUPPORTED if r not in moved]
    sa = SimpleNamespace(
        attention_backend="flashinfer", prefill_attention_backend=None, decode_attention_backend="triton",
        get_attention_backends=lambda: ("flashinfer", "triton"),
    )  # fmt: skip
    if release == SUPPORTED[0] or importlib.util.find_spec(VIEWS) is not None:
        assert contacts.attention_backends(sa) == ("flashinfer", "triton")


def test_dp_attention_as_of_each_end(release):
    assert contacts.dp_attention(SimpleNamespace(enable_dp_attention=True, attn_dp_size=1))
    off = SimpleNamespace(enable_dp_attention=False, attn_dp_size=2)
    assert contacts.dp_attention(off) is (release == SUPPORTED[-1])  # --attn-dp-size is 0.5.22's flag


# ---- server_args parameters dropped in 0.5.18 ---------------------------------------------------------
DROPPED_SERVER_ARGS = (
    "sglang.srt.managers.utils.compute_num_reserved_tokens",
    "sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode",
    "sglang.srt.speculative.spec_info.create_dummy_verify_input",
)


@pytest.mark.parametrize("symbol", DROPPED_SERVER_ARGS)
def test_server_args_parameters_end_at_0_5_17(symbol):
    assert changes_at(symbol, "server_args") == ["0.5.17"]


def test_the_call_server_args_come_from_the_call_or_the_published_config(monkeypatch):
    sa = SimpleNamespace(speculative_algorithm="PILLAR")
    monkeypatch.setattr(contacts, "resolved", lambda s: s)
    assert contacts.call_server_args((sa,), {}) is sa and contacts.call_server_args((), {"server_args": sa}) is sa
    monkeypatch.setattr("sglang.srt.runtime_context.get_server_args", lambda: sa)
    assert contacts.call_server_args((), {}) is sa


@pytest.mark.parametrize("end", ENDS)
def test_the_dummy_verify_input_hook_reads_each_release_by_name(end):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_sparsespec.patches.cuda_graph import warmup_dummy_verify_input

    stock = stand_in("sglang.srt.speculative.spec_info.create_dummy_verify_input", end)
    given = {"spec_algorithm": SpeculativeAlgorithm.from_string("EAGLE"), "server_args": object(),
             "custom_mask": "mask", "num_tokens_per_req": 5, "is_draft_worker": False}  # fmt: skip
    names = list(inspect.signature(stock).parameters)
    args = [given[n] for n in names]
    assert warmup_dummy_verify_input(stock, *args) == dict(zip(names, args))  # stock's, passed through
    args[0] = SpeculativeAlgorithm.from_string("PILLAR")
    dummy = warmup_dummy_verify_input(stock, *args)
    assert (dummy.spec_steps, dummy.draft_token_num, dummy.topk, dummy.custom_mask) == (4, 5, 1, "mask")


# ---- the verify's logprobs and retract_all ------------------------------------------------------------
def test_spec_logprobs_are_computed_by_each_release_s_function(release, monkeypatch):
    old = "sglang.srt.layers.logprob_processor.compute_spec_v2_logprobs"
    new = "sglang.srt.layers.logprob_processor.compute_spec_logprobs"
    assert [r for r in SUPPORTED if recorded(old, r)] == ["0.5.17"]
    assert [r for r in SUPPORTED if recorded(new, r)] == list(SUPPORTED[1:])
    symbol = old if release == SUPPORTED[0] else new
    calls = []
    stock = stand_in(symbol, release)
    monkeypatch.setattr(symbol, lambda *a, **kw: calls.append(stock(*a, **kw)), raising=False)
    contacts.compute_spec_logprobs("batch", "logits", "predict", "accept_index", 3)
    assert calls[0]["accept_index"] == "accept_index" and calls[0].get("speculative_num_steps") == (
        3 if release == SUPPORTED[0] else None
    )


def test_retract_all_takes_server_args_up_to_0_5_18_only(release, monkeypatch):
    symbol = "sglang.srt.managers.schedule_batch.retract_all"
    assert changes_at(symbol, "server_args") == ["0.5.17", "0.5.18"]
    stock, calls = stand_in(symbol, release), []
    monkeypatch.setattr("sglang.srt.managers.schedule_batch.retract_all", lambda **kw: calls.append(stock(**kw)))
    contacts.retract_all(server_args="sa", **{n: n for n in inspect.signature(stock).parameters if n != "server_args"})
    assert calls[0].get("server_args") == ("sa" if release == SUPPORTED[0] else None)


# ---- what SGLang calls PILLAR with ---------------------------------------------------------------------
def test_the_worker_takes_the_keywords_every_release_builds_a_worker_with():
    from sglang_sparsespec.patches.worker import PillarWorker

    for r in SUPPORTED:  # ps is passed up to 0.5.20
        params = stand_in("sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__", r)
        names = [n for n in inspect.signature(params).parameters if n != "self"]
        inspect.signature(PillarWorker).bind(**{n: None for n in names})


def test_the_worker_takes_the_keywords_every_release_steps_a_speculative_worker_with():
    """The scheduler steps the worker as it steps EAGLE's (from 0.5.19 under --disable-overlap-schedule: with
    pp_proxy_tensors), so every keyword of EAGLEWorkerV2.forward_batch_generation binds on PILLAR's."""
    from sglang_sparsespec.patches.worker import PillarWorker

    for r in SUPPORTED:
        params = stand_in("sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation", r)
        names = [n for n in inspect.signature(params).parameters if n not in ("self", "batch")]
        inspect.signature(PillarWorker.forward_batch_generation).bind(None, None, **{n: None for n in names})


def test_a_weight_update_loads_the_target_once(monkeypatch):
    """SGLang's own weight updater with PILLAR as its speculative worker: disk, IPC and tensor updates each reach
    the target model once (up to 0.5.20 the scheduler asks both workers; from 0.5.21 the runners each lists)."""
    from sglang.srt.managers import io_struct
    from sglang.srt.managers.scheduler_components import weight_updater as wu

    from sglang_sparsespec.patches.worker import PillarWorker

    loads: list[str] = []

    def load(kind):
        return lambda *a, **k: (loads.append(kind), (True, "ok"))[1]

    runner = SimpleNamespace(weight_updater=SimpleNamespace(
        update_weights_from_disk=load("disk"), update_weights_from_ipc=load("ipc"),
        update_weights_from_tensor=load("tensor")))  # fmt: skip
    target = SimpleNamespace(
        update_weights_from_disk=load("disk"), update_weights_from_ipc=load("ipc"),
        update_weights_from_tensor=load("tensor"), weight_update_runners=lambda: [("target", runner)],
        deserialize_own_rank=lambda tensors: tensors, model_runner=runner,
    )  # fmt: skip
    worker = object.__new__(PillarWorker)
    worker._target_worker = target
    cls = wu.SchedulerWeightUpdaterManager
    manager = object.__new__(cls)  # its fields as the scheduler fills them
    fields = {"tp_worker": target, "draft_worker": worker, "tp_cpu_group": None, "metrics_collector": None,
              "flush_cache": lambda **k: True, "_session": SimpleNamespace()}  # fmt: skip
    for name, value in fields.items():
        if name in cls.__dataclass_fields__:
            object.__setattr__(manager, name, value)
    monkeypatch.setattr(torch.distributed, "barrier", lambda **k: None)
    if "_session" in cls.__dataclass_fields__:  # from 0.5.21 updates run inside a session
        monkeypatch.setattr(wu.msgspec.structs, "replace", lambda session, **k: session)
        monkeypatch.setattr(cls, "record_weight_version_after_update", lambda self, version: None)
        # 0.5.21 flushes after a request alone; later releases pass the outcome through it
        monkeypatch.setattr(cls, "flush_cache_after_weight_update", lambda self, req, *outcome: outcome or None)
    manager.update_weights_from_disk(io_struct.UpdateWeightFromDiskReqInput(model_path="m"))
    manager.update_weights_from_ipc(io_struct.UpdateWeightsFromIPCReqInput(zmq_handles={}))
    manager.update_weights_from_tensor(io_struct.UpdateWeightsFromTensorReqInput(serialized_named_tensors=[]))
    assert sorted(loads) == ["disk", "ipc", "tensor"]


@pytest.mark.parametrize("end", ENDS)
def test_the_verify_input_is_built_with_the_fields_every_release_defaults(end):
    """PILLAR builds EagleVerifyInput and GenerationBatchResult by keyword; the fields later releases added
    must not be required (each release's recorded field list, checked against the installed class)."""
    import dataclasses

    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    for cls, symbol in ((EagleVerifyInput, "sglang.srt.speculative.eagle_info.EagleVerifyInput"),
                        (GenerationBatchResult, "sglang.srt.managers.utils.GenerationBatchResult")):  # fmt: skip
        assert recorded(symbol, end) is not None
        missing = dataclasses.MISSING
        required = [f.name for f in dataclasses.fields(cls)
                    if f.init and f.default is missing and f.default_factory is missing]  # fmt: skip
        # The fields PILLAR passes cover the required ones (the same on both ends).
        assert set(required) <= set(recorded(symbol, SUPPORTED[0]).strip("()").split(", ")), (cls, required)


# ---- the offload pool's releases ------------------------------------------------------------------------
def test_offload_serves_its_releases_and_is_refused_on_the_rest(release):
    from sglang_sparsespec.patches.offload_kv import offload_refusal

    sa = SimpleNamespace(speculative_algorithm="PILLAR", page_size=1, enable_hierarchical_cache=False,
                         enable_dp_attention=False, pp_size=1, tp_size=1, disaggregation_mode="null",
                         kv_cache_dtype="auto")  # fmt: skip
    refusal = offload_refusal(sa)
    if release in contacts.OFFLOAD_RELEASES:
        assert refusal is None
    else:
        assert refusal.startswith("--pillar-offload-host-gb serves SGLang 0.5.17 through 0.5.20")
        assert "\n" not in refusal
    for hook in HOOKS:
        if hook.fn.__module__.endswith("offload_hooks") and hook.fn.__name__ != "validate_offload_flag":
            assert hook.versions == contacts.OFFLOAD_RELEASES
