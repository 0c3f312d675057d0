"""The benchmark harness's test doubles: a fake SGLang server (fakes/sglang_server.py) and a fake bench_serving
(fakes/fake_bench.py), a word-level tokenizer, a prompt folder, and the fixtures that route the harness to them."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

# benchmarks/ is a folder at the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_driver, server  # noqa: E402

FAKES = Path(__file__).resolve().with_name("fakes")
FAKE_SERVER = FAKES / "sglang_server.py"


@pytest.fixture()
def fake_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point every BenchDriver at fakes/fake_bench.py (a module on the children's PYTHONPATH); returns its name."""
    monkeypatch.setenv("PYTHONPATH", str(FAKES))
    monkeypatch.setattr(bench_driver, "BENCH_MODULE", "fake_bench")
    return "fake_bench"


@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer with a chat template, saved like a model folder's tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "<|user|>", "<|assistant|>"] + [f"w{i}" for i in range(50)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    return path


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    (d / "aime24.jsonl").write_text("".join(json.dumps({"problem": f"w{i} w{i + 1}"}) + "\n" for i in range(3)))
    (d / "amc23.jsonl").write_text(json.dumps({"problem": "w9 w8 w7", "answer": "1"}) + "\n\n")
    return d


@pytest.fixture()
def fake_sglang(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Route Server.sglang to the fake server script (same flags, so spec vs stock still shows)."""
    monkeypatch.setattr(
        server,
        "launch_command",
        lambda model, flags, host, port: [
            sys.executable,
            str(FAKE_SERVER),
            "--host",
            host,
            "--port",
            str(port),
            *flags,
        ],
    )
    return FAKE_SERVER


def fake_server(tmp_path: Path, **env: str) -> server.Server:
    """A Server on the fake script, not started, its log in ``tmp_path``."""
    port = server.free_port()
    return server.Server(
        [sys.executable, str(FAKE_SERVER), "--port", str(port)], port=port, log_path=tmp_path / "srv.log", env=env
    )


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat[stat.rfind(")") + 2] == "Z":
            return True
        time.sleep(0.1)
    return False


def cli(**flags: object) -> list[str]:
    """Command-line arguments from keywords, in order: ``data_dir=d`` is ``--data-dir d``, ``stop_at_eos=True`` a
    bare ``--stop-at-eos``."""
    argv = []
    for name, value in flags.items():
        argv.append("--" + name.replace("_", "-"))
        if value is not True:
            argv.append(str(value))
    return argv
