"""patches/spec_algo.py: a model PILLAR cannot serve is refused at launch with one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import SMOLLM2_CONFIG

MROPE = {"rope_scaling": {"type": "default", "rope_type": "default", "mrope_section": [16, 24, 24]}}


def _args(model_dir: Path, **overrides):
    """What resolution decided for these ServerArgs (resolved as a launch resolves them)."""
    from sglang.srt.server_args import ServerArgs

    from sglang_sparsespec.patches.contacts import resolve, resolved

    base = dict(model_path=str(model_dir), attention_backend="triton", skip_tokenizer_init=True, device="cpu")
    return resolved(resolve(ServerArgs(**{**base, **overrides})))


@pytest.mark.parametrize("algorithm, refused", [("pillar", True), (None, False)])
def test_mrope_models_are_refused_under_pillar_only(tmp_path, algorithm, refused):
    """Qwen-VL-style rotary positions (mrope_section): the draft runner never sets mrope_positions."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM2_CONFIG, **MROPE}))
    if not refused:
        assert _args(tmp_path, speculative_algorithm=algorithm).speculative_algorithm is None
        return
    with pytest.raises(ValueError) as err:
        _args(tmp_path, speculative_algorithm=algorithm)
    text = str(err.value)
    assert text.startswith("--speculative-algorithm PILLAR") and "mrope" in text and "\n" not in text
    plain = tmp_path / "plain"  # another folder: SGLang caches a path's config
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    assert _args(plain, speculative_algorithm=algorithm).speculative_num_steps == 8


@pytest.mark.parametrize("flags", [{"enable_lora": True}, {"lora_paths": ["adapter=/tmp/adapter"]}])
def test_lora_is_refused_under_pillar(llama_config_dir, flags):
    """The draft steps build their ForwardBatch outside ForwardBatch.init_new, which prepares LoRA batches."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    with pytest.raises(ValueError) as err:
        _args(llama_config_dir, speculative_algorithm="pillar", **flags)
    text = str(err.value)
    assert text.startswith("--speculative-algorithm PILLAR") and "LoRA" in text and "\n" not in text


@pytest.mark.parametrize(
    "flags, named",
    [
        ({"tp_size": 2, "dcp_size": 2}, "--dcp-size"),
        ({"moe_a2a_backend": "deepep"}, "--moe-a2a-backend"),
        ({"enable_pdmux": True}, "--enable-pdmux"),
        ({"enable_two_batch_overlap": True}, "--enable-two-batch-overlap"),
        ({"enable_return_routed_experts": True}, "--enable-return-routed-experts"),
        ({"enable_page_major_kv_layout": True}, "--enable-page-major-kv-layout"),
        ({"enable_unified_memory": True}, "--enable-"),  # it implies the page-major layout; either flag is named
    ],
)
def test_forward_paths_the_rounds_bypass_and_kv_layouts_are_refused_under_pillar(llama_config_dir, flags, named):
    """Flags whose set-up SGLang does in the model runner paths PILLAR's draft and plain steps do not take, and
    KV cache layouts PILLAR's kernels do not read."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    with pytest.raises(ValueError) as err:
        _args(llama_config_dir, speculative_algorithm="pillar", **flags)
    text = str(err.value)
    assert text.startswith("--speculative-algorithm PILLAR") and named in text and "\n" not in text


def test_a_checkpoint_that_makes_the_kv_cache_fp8_stops_the_worker(llama_config_dir):
    """--kv-cache-dtype auto resolves to fp8 for checkpoints that ask for it, past the launch check on the flag."""
    import torch
    from sglang.srt.plugins import load_plugins

    from sglang_sparsespec.patches.worker import PillarWorker

    load_plugins()
    sa = _args(llama_config_dir, speculative_algorithm="pillar")
    target = SimpleNamespace(model_runner=SimpleNamespace(kv_cache_dtype=torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="needs a 16-bit KV cache"):
        PillarWorker(sa, 0, 0, target)


@pytest.mark.parametrize(
    "flags, env, named",
    [
        ({"speculative_num_steps": 0}, {}, "--speculative-num-steps >= 1, got 0"),
        ({"dtype": "float32"}, {}, "serves bf16 / fp16 models; this one runs in torch.float32: pass --dtype bfloat16"),
        ({}, {"SPARSESPEC_DRAFT_VOCAB": "49152"}, "--pillar-draft-vocab 49152 is not below the model's vocabulary"),
        ({}, {"SPARSESPEC_BUDGET_RATIO": "2"}, "--pillar-budget-ratio / SPARSESPEC_BUDGET_RATIO must be in (0, 1]"),
        ({"speculative_token_map": "/tmp/map.pt"}, {}, "--speculative-token-map is not supported"),
        ({"speculative_draft_attention_backend": "fa3"}, {}, "--speculative-draft-attention-backend is not supported"),
        ({"speculative_draft_model_revision": "main"}, {}, "--speculative-draft-model-revision is not supported"),
    ],
)
def test_values_that_would_be_ignored_or_fail_later_are_refused_at_launch(llama_config_dir, monkeypatch, flags, env,
                                                                         named):  # fmt: skip
    """k = 0 is not k = 8, a float32 model is not a bf16 one, a draft vocabulary must be smaller than the model's, a
    knob's error names the flag beside its variable, and a draft model's settings have no draft model to apply to."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as err:
        _args(llama_config_dir, speculative_algorithm="pillar", **flags)
    text = str(err.value)
    assert text.startswith("--speculative-algorithm PILLAR") and named in text and "\n" not in text
