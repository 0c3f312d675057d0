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
