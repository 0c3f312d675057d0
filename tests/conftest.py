from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
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


def pytest_terminal_summary(terminalreporter) -> None:
    """Where the suite ran, as the run's last line: a GPU run's log is checked in as a result, so it names its
    device, date, commit and releases itself."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a folder of the checkout
    from benchmarks.meta import run_metadata

    meta = run_metadata("tests")
    fields = ("device", "date_utc", "git_commit", "sglang_version", "torch_version")
    line = ", ".join(f"{k} {meta[k]}" for k in fields)
    terminalreporter.write_line(f"ran on: {line}, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}")


@pytest.fixture(scope="session")
def llama_config_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("smollm2_config")
    (d / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    return d


@pytest.fixture(scope="session")
def sglang_groups(llama_config_dir):
    """SGLang's process groups at world size 1, which its graph_capture() reads: what the server sets up before
    any runner captures a graph. The configuration is published first (from 0.5.23 the groups read their widths
    from it); gloo, since a group of one never communicates."""
    import socket

    from sglang.srt import runtime_context
    from sglang.srt.distributed import parallel_state
    from sglang.srt.server_args import ServerArgs
    from sglang_sparsespec.patches.contacts import resolve

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sa = resolve(ServerArgs(model_path=str(llama_config_dir), skip_tokenizer_init=True, device=device))
    runtime_context.publish(sa, role="test")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parallel_state.init_distributed_environment(
        world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo"
    )
    parallel_state.initialize_model_parallel()
    yield
    parallel_state.destroy_distributed_environment()
    runtime_context.reset_context()
