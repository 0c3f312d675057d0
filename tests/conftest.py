from __future__ import annotations

import json
from pathlib import Path

import pytest
import triton_env  # noqa: F401  (sets TRITON_INTERPRET before any kernel is decorated)

# SmolLM2-135M-Instruct's architecture: enough for SGLang to resolve a model config
# without weights (ServerArgs validation never loads weights).
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@pytest.fixture(scope="session")
def llama_config_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("smollm2_config")
    (d / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    return d
