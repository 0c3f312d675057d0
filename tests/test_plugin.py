"""Plugin loading, hook application and ServerArgs validation through SGLang's real code."""

from __future__ import annotations

import importlib.metadata

import pytest

pytest.importorskip("sglang")

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()

from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang_sparsespec.patches import HOOKS  # noqa: E402
from sglang_sparsespec.patches.contacts import attention_backends, resolve, resolved  # noqa: E402
from sglang_sparsespec.patches.signatures import recorded  # noqa: E402
from sglang_sparsespec.patches.spec_algo import PillarSpecAlgo  # noqa: E402


def _server_args(model_dir, **overrides) -> ServerArgs:
    """ServerArgs resolved (and validated) as a launch resolves them, on any supported release."""
    base = dict(
        model_path=str(model_dir),
        attention_backend="triton",
        speculative_algorithm="pillar",
        skip_tokenizer_init=True,
        device="cpu",
    )
    base.update(overrides)
    return resolve(ServerArgs(**base))


def _args(model_dir, **overrides):
    """What resolution decided for those ServerArgs, field by field."""
    return resolved(_server_args(model_dir, **overrides))


def one_gpu_only(model_dir) -> None:
    """The launch takes the knobs set now on one GPU and refuses them at --tp-size 2, in one line."""
    assert _args(model_dir).speculative_algorithm == "PILLAR"
    with pytest.raises(ValueError, match="--tp-size 1") as err:
        _args(model_dir, tp_size=2)
    assert "\n" not in str(err.value)


def _call_args(symbol: str, server_args) -> tuple:
    """The arguments a server-args function takes in the installed release: the ServerArgs up to 0.5.17,
    none from 0.5.18 (it reads the published configuration), as its recorded signature says."""
    return (server_args,) if "server_args" in (recorded(symbol) or "") else ()


def test_entry_point_is_declared():
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    assert any(ep.value == "sglang_sparsespec.plugin:register" for ep in eps)


def test_pillar_is_registered_with_scheduler_methods():
    algo = SpeculativeAlgorithm.from_string("Pillar")
    assert isinstance(algo, PillarSpecAlgo)
    assert algo.supports_overlap and algo.is_speculative() and not algo.is_eagle()
    assert algo.need_topk() is False and algo.carries_draft_hidden_states() is False


def test_every_hook_of_the_installed_release_is_applied():
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry

    for hook in (h for h in HOOKS if h.applies()):
        assert hook.target in HookRegistry._patched, hook.target
        owner_path, _, attr = hook.target.rpartition(".")
        patched = getattr(pkgutil.resolve_name(owner_path), attr)
        # HookRegistry's wrapper keeps the SGLang original as __wrapped__.
        assert getattr(patched, "__wrapped__", None) is not None, hook.target
        assert hook.why


def test_every_direct_sglang_import_of_the_patches_resolves():
    """The patches import most SGLang symbols lazily, inside code that runs only on a GPU server;
    a renamed or misspelled one would surface there first. Each ``from sglang.X import Y`` in
    patches/ must resolve against the installed SGLang (as a module attribute or a submodule); what
    moved between releases is imported through ``contacts`` by the path of the installed one."""
    import ast
    import importlib
    import importlib.util
    from pathlib import Path

    import sglang_sparsespec.patches as patches_pkg

    missing, seen = [], 0
    for path in sorted(Path(patches_pkg.__file__).parent.glob("*.py")):
        if path.name == "contacts.py":  # imports what the release it adapts to has (tests/test_contacts.py)
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang.")):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                seen += 1
                if not hasattr(module, alias.name) and importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                    missing.append(f"{path.name}: from {node.module} import {alias.name}")
    assert seen > 50 and not missing, missing


@pytest.fixture
def published(llama_config_dir):
    """PILLAR's ServerArgs (k = 6) published as the scheduler's process has them (from 0.5.18 the sizing
    functions read the published configuration)."""
    from sglang.srt import runtime_context

    sa = _server_args(llama_config_dir, speculative_num_steps=6)
    runtime_context.publish(sa, role="test")
    yield sa
    runtime_context.reset_context()


RESERVED = "sglang.srt.managers.utils.compute_num_reserved_tokens"
ALLOC_RESERVE = "sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode"


def test_hooked_functions_dispatch_to_pillar(published):
    from sglang.srt.managers.utils import compute_num_reserved_tokens
    from sglang.srt.mem_cache import kv_cache_builder

    assert compute_num_reserved_tokens(*_call_args(RESERVED, published)) == 7
    if recorded("sglang.srt.mem_cache.kv_cache_builder.get_draft_kv_pool") is not None:
        algo = SpeculativeAlgorithm.from_string("PILLAR")
        pool = kv_cache_builder.get_draft_kv_pool(draft_worker=object(), spec_algorithm=algo, server_args=published)
        assert pool is None


def test_mixed_phases_reserve_room_for_carried_chains(published, monkeypatch):
    from sglang.srt.managers.utils import compute_num_reserved_tokens
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode

    reserve_args = _call_args(ALLOC_RESERVE, published)
    assert get_alloc_reserve_per_decode(*reserve_args) == 14  # spec v2's 2 (k + 1)
    monkeypatch.setenv("SPARSESPEC_BATCH_PHASES", "mixed")
    assert get_alloc_reserve_per_decode(*reserve_args) == 21
    assert compute_num_reserved_tokens(*_call_args(RESERVED, published)) == 14
    # eagle_utils imports it by name: the hook reaches that copy too.
    from sglang.srt.speculative import eagle_utils

    assert eagle_utils.get_alloc_reserve_per_decode(*reserve_args) == 21


def test_mixed_phases_need_one_gpu(llama_config_dir, monkeypatch):
    monkeypatch.setenv("SPARSESPEC_BATCH_PHASES", "mixed")
    with pytest.raises(ValueError, match="--tp-size 1") as err:
        _args(llama_config_dir, tp_size=2)
    assert "\n" not in str(err.value)


def test_defaults_fill_spec_shape_fields(llama_config_dir):
    sa = _args(llama_config_dir)
    assert sa.speculative_algorithm == "PILLAR"
    assert (sa.speculative_num_steps, sa.speculative_eagle_topk, sa.speculative_num_draft_tokens) == (8, 1, 9)
    assert sa.speculative_use_rejection_sampling is True
    assert sa.page_size == 1
    assert sa.max_running_requests == 256
    assert sa.disable_overlap_schedule is False


def test_flashinfer_prefills_and_triton_verifies(llama_config_dir):
    sa = _args(llama_config_dir, attention_backend="flashinfer")
    assert attention_backends(sa) == ("flashinfer", "triton")
    # HybridAttnBackend sends TARGET_VERIFY to its decode (Triton) child only in mode "decode".
    assert sa.speculative_attention_mode == "decode"
    assert (sa.speculative_num_steps, sa.speculative_num_draft_tokens, sa.page_size) == (8, 9, 1)


def test_triton_stays_a_single_backend(llama_config_dir):
    sa = _args(llama_config_dir)
    assert (sa.attention_backend, sa.prefill_attention_backend, sa.decode_attention_backend) == ("triton", None, None)
    assert sa.speculative_attention_mode == "prefill"


def test_num_steps_flag_sets_k(llama_config_dir):
    sa = _args(llama_config_dir, speculative_num_steps=4, max_running_requests=32)
    assert (sa.speculative_num_steps, sa.speculative_num_draft_tokens, sa.max_running_requests) == (4, 5, 32)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(page_size=16), "--page-size 1"),
        ({"attention_backend": "fa3"}, "FA3 is not supported"),
        ({"attention_backend": "torch_native"}, "--attention-backend triton or flashinfer only"),
        ({"attention_backend": "flashinfer", "decode_attention_backend": "fa3"}, "FA3 is not supported"),
        ({"attention_backend": "flashinfer", "decode_attention_backend": "flashinfer"}, "must be triton"),
        (dict(speculative_num_draft_tokens=5), "--speculative-num-draft-tokens must be 9"),
        (dict(speculative_eagle_topk=4), "--speculative-eagle-topk must be 1"),
        (dict(speculative_accept_threshold_single=0.5), "lossless"),
        (dict(kv_cache_dtype="fp8_e4m3"), "16-bit KV cache"),
    ],
)
def test_unsupported_flags_fail_with_one_line(llama_config_dir, overrides, message):
    with pytest.raises(ValueError) as err:
        _args(llama_config_dir, **overrides)
    text = str(err.value)
    assert message in text and "\n" not in text and text.startswith("--speculative-algorithm PILLAR")


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallelism_is_accepted(tmp_path, tp):
    import json

    from conftest import SMOLLM2_CONFIG

    # 8 query / 4 KV heads: tp = 8 replicates KV heads (one per rank), as SGLang does.
    (tmp_path / "config.json").write_text(
        json.dumps({**SMOLLM2_CONFIG, "num_attention_heads": 8, "num_key_value_heads": 4})
    )
    sa = _args(tmp_path, tp_size=tp)
    assert (sa.tp_size, sa.speculative_num_draft_tokens) == (tp, 9)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}, "DP attention"),
        ({"tp_size": 2, "attn_dp_size": 2}, "DP attention"),  # the flag from 0.5.22
        ({"pp_size": 2}, "pipeline parallelism"),
    ],
)
def test_tensor_parallelism_still_refuses_dp_attention_and_pipelines(llama_config_dir, overrides, message):
    import inspect

    if not set(overrides) <= set(inspect.signature(ServerArgs).parameters):
        pytest.skip("--attn-dp-size is a flag from SGLang 0.5.22")
    with pytest.raises(ValueError, match=message):
        _args(llama_config_dir, **overrides)


def test_bad_environment_knob_fails_in_launcher(llama_config_dir, monkeypatch):
    monkeypatch.setenv("SPARSESPEC_POLICY", "magic")
    with pytest.raises(ValueError, match="SPARSESPEC_POLICY"):
        _args(llama_config_dir)
    monkeypatch.setenv("SPARSESPEC_POLICY", "streaming")
    monkeypatch.setenv("SPARSESPEC_BUDGET_RATIO", "1.5")
    with pytest.raises(ValueError, match="BUDGET_RATIO"):
        _args(llama_config_dir)


@pytest.mark.parametrize(
    "extra, gap",
    [
        ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4096}, "sliding-window"),
        ({"sliding_window": 4096, "use_sliding_window": False}, None),  # Qwen2-style: declared, switched off
    ],
)
def test_model_attention_is_checked_at_launch(tmp_path, extra, gap):
    import json

    from conftest import SMOLLM2_CONFIG

    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM2_CONFIG, **extra}))
    if gap is None:
        assert _args(tmp_path).speculative_num_steps == 8
        return
    with pytest.raises(ValueError) as err:
        _args(tmp_path)
    text = str(err.value)
    assert gap in text and "\n" not in text and text.startswith("--speculative-algorithm PILLAR")


def test_unsupported_attention_kinds():
    from types import SimpleNamespace

    from sglang.srt.configs.model_config import AttentionArch
    from sglang_sparsespec.patches.spec_algo import unsupported_attention

    def config(arch=AttentionArch.MHA, linear=None, swa=False, **text):
        return SimpleNamespace(
            attention_arch=arch,
            linear_attn_registry_result=linear,
            is_hybrid_swa=swa,
            hf_text_config=SimpleNamespace(**text),
        )

    assert unsupported_attention(config()) is None
    assert "MLA" in unsupported_attention(config(arch=AttentionArch.MLA))
    assert "linear" in unsupported_attention(config(layer_types=["full_attention", "linear_attention"]))
    assert "linear" in unsupported_attention(config(linear=object()))
    assert "sliding" in unsupported_attention(config(layer_types=["sliding_attention", "full_attention"]))
    assert "sliding" in unsupported_attention(config(swa=True))


def test_pillar_knobs_are_launch_flags(llama_config_dir, monkeypatch):
    import argparse

    from sglang.srt.server_args import prepare_server_args

    from sglang_sparsespec.config import KNOBS, PillarConfig

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    text = parser.format_help()
    assert all(knob.flag in text for knob in KNOBS) and "--pillar-policy" in text
    for knob in KNOBS:
        # The flags hook writes os.environ itself (as the launcher must). delenv of an unset variable
        # records nothing to undo, so setenv first: teardown then removes what the hook wrote instead of
        # leaking e.g. SPARSESPEC_POLICY=streaming into later tests' servers.
        monkeypatch.setenv(knob.env, "")
        monkeypatch.delenv(knob.env)
    monkeypatch.setenv("SPARSESPEC_MIN_BUDGET", "64")  # the fallback, for knobs without a flag
    base = [
        "--model-path",
        str(llama_config_dir),
        "--attention-backend",
        "triton",
        "--speculative-algorithm",
        "PILLAR",
        "--skip-tokenizer-init",
        "--device",
        "cpu",
    ]
    resolve(prepare_server_args(base + ["--pillar-budget-ratio", "0.1", "--pillar-policy", "streaming"]))
    # What the scheduler processes inherit and resolve: the flags, then the variables, then defaults.
    cfg = PillarConfig.from_env(8)
    assert (cfg.budget_ratio, cfg.policy.value, cfg.min_budget) == (0.1, "streaming", 64)
    monkeypatch.setenv("SPARSESPEC_BUDGET_RATIO", "0.2")
    resolve(prepare_server_args(base + ["--pillar-budget-ratio", "0.3"]))
    assert PillarConfig.from_env(8).budget_ratio == 0.3  # the flag wins over the variable
    with pytest.raises(ValueError, match="SPARSESPEC_SELECT_EVERY") as err:
        resolve(prepare_server_args(base + ["--pillar-select-every", "0"]))
    assert "\n" not in str(err.value)
    with pytest.raises(SystemExit):  # argparse's own one-line error for a bad choice
        resolve(prepare_server_args(base + ["--pillar-policy", "magic"]))


def test_pillar_warmup_joins_the_server_warmups_unless_skipped(llama_config_dir):
    """SGLang runs the named custom warmups before the HTTP server listens; PILLAR's is added after the
    user's own, and --skip-server-warmup (a user who wants the fastest start) leaves it out."""
    from sglang.srt.entrypoints.warmup import _warmup_registry

    from sglang_sparsespec.patches.serve_warmup import pillar_warmup

    assert _warmup_registry["pillar"] is pillar_warmup
    assert _args(llama_config_dir).warmups == "pillar"
    assert _args(llama_config_dir, warmups="voice_chat").warmups == "voice_chat,pillar"
    assert _args(llama_config_dir, warmups="pillar").warmups == "pillar"
    assert _args(llama_config_dir, skip_server_warmup=True).warmups is None


@pytest.mark.parametrize("page_size", [1, 2])
def test_spec_alloc_commits_the_reserved_lengths(page_size):
    """The hooked alloc_for_spec_decode (SGLang's own body, nothing to allocate) still raises each
    request's allocated length to its next length, whether it got a list (one-token pages) or the tensor."""
    from types import SimpleNamespace

    import torch
    from sglang.srt.speculative import eagle_utils

    reqs = [SimpleNamespace(kv=SimpleNamespace(kv_allocated_len=n)) for n in (5, 40, 9)]
    nxt = torch.tensor([12, 30, 9], dtype=torch.int32)
    tree_cache = SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(page_size=page_size))
    eagle_utils.alloc_for_spec_decode(
        tree_cache,
        None,
        reqs=reqs,
        req_pool_indices=None,
        cur_kv_lens=None,
        cur_kv_lens_cpu=None,
        nxt_kv_lens=None,
        nxt_kv_lens_cpu=nxt,
        num_needed_tokens=0,
    )
    assert [r.kv.kv_allocated_len for r in reqs] == [12, 40, 9]
    assert all(type(r.kv.kv_allocated_len) is int for r in reqs)


@pytest.mark.parametrize("backend", ["ascend", "token_oracle", "registered"])
def test_sampling_backends_the_verify_cannot_reproduce_fail_with_one_line(llama_config_dir, monkeypatch, backend):
    # device "cuda" keeps the asked-for backend (SGLang forces pytorch on a CPU device); building
    # ServerArgs needs no GPU. A backend registered through SGLang's API has a law of its own too.
    from sglang.srt.layers import sampler
    from sglang.srt.server_args import SAMPLING_BACKEND_CHOICES

    if backend == "registered":
        monkeypatch.setattr(sampler, "_CUSTOM_SAMPLER_FACTORIES", {})
        monkeypatch.setattr("sglang.srt.server_args.SAMPLING_BACKEND_CHOICES", set(SAMPLING_BACKEND_CHOICES))
        sampler.register_sampler_backend(backend, sampler.Sampler)
    with pytest.raises(ValueError) as err:
        _args(llama_config_dir, device="cuda", sampling_backend=backend)
    text = str(err.value)
    assert f"--sampling-backend {backend} is not supported" in text and "\n" not in text
    assert text.startswith("--speculative-algorithm PILLAR")
    for served in ("flashinfer", "pytorch"):
        assert _args(llama_config_dir, device="cuda", sampling_backend=served).sampling_backend == served


def test_the_default_sampling_backend_launches(llama_config_dir):
    # On a GPU device the backend is unset while the speculative algorithm validates (SGLang settles it to
    # flashinfer or pytorch afterwards): a launch without --sampling-backend must pass.
    assert _args(llama_config_dir, device="cuda").sampling_backend in ("flashinfer", "pytorch")


def test_rl_on_policy_target_fails_with_one_line(llama_config_dir):
    # Stock samples temperature-only batches from a bf16 log-softmax under this flag; the verify's law is fp32.
    with pytest.raises(ValueError) as err:
        _args(llama_config_dir, rl_on_policy_target="fsdp")
    text = str(err.value)
    assert text.startswith("--speculative-algorithm PILLAR: does not support --rl-on-policy-target fsdp")
    assert "\n" not in text
    assert _args(llama_config_dir, enable_deterministic_inference=True).sampling_backend == "pytorch"
