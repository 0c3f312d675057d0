"""CPU tests of benchmarks/sweep.py: the chunk matrix, its status from result JSONs, and what `run` hands
to the throughput entry point."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# benchmarks/ is a folder at the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import sweep, throughput  # noqa: E402


def write_result(results: Path, chunk: sweep.Chunk, tag: str, ok: list[int]) -> None:
    runs = [{"concurrency": c, "status": "ok" if c in ok else "failed"} for c in sweep.CONCURRENCY]
    chunk.result_file(tag, results).write_text(json.dumps({"kind": "throughput", "runs": runs}))


def test_chunks_cover_the_matrix_stock_first_per_length() -> None:
    table = sweep.chunks()
    assert len(table) == len(sweep.OUTPUT_LENS) * len(sweep.CONFIGS)
    assert [ch.index for ch in table] == list(range(len(table)))
    assert {(ch.output_len, ch.config) for ch in table} == {(n, c) for n in sweep.OUTPUT_LENS for c in sweep.CONFIGS}
    for n in sweep.OUTPUT_LENS:
        assert [ch.config for ch in table if ch.output_len == n][0] == "stock"
    ch = table[0]
    assert ch.run_id("abc1234") == "sweep-abc1234-2048"
    assert ch.result_file("abc1234", Path("/r")) == Path("/r/throughput_sweep-abc1234-2048_stock.json")


def test_status_and_next(tmp_path: Path) -> None:
    table = sweep.chunks()
    write_result(tmp_path, table[0], "t1", list(sweep.CONCURRENCY))
    write_result(tmp_path, table[1], "t1", [1, 8])
    write_result(tmp_path, table[2], "other", list(sweep.CONCURRENCY))  # another tag does not count
    assert sweep.chunk_state(table[0], "t1", tmp_path) == ("done", list(sweep.CONCURRENCY))
    assert sweep.chunk_state(table[1], "t1", tmp_path) == ("partial", [1, 8])
    assert sweep.chunk_state(table[2], "t1", tmp_path) == ("missing", [])
    md = sweep.status_table("t1", tmp_path)
    assert "| 0 | 2048 | stock | done | 1 8 32 64 128 256 |" in md and "| 1 | 2048 | stock-flashinfer | partial | 1 8 |" in md
    assert "| 2 | 2048 | ngram | missing | - |" in md
    args = sweep.parse_args(["run", "--tag", "t1", "--results-dir", str(tmp_path), "--model", "m", "--data-dir", "d",
                             "--out", "o", "--next", "2"])  # fmt: skip
    assert [ch.index for ch in sweep.pick(args)] == [1, 2]  # the partial chunk is run again


def test_run_hands_each_chunk_to_throughput(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], object]] = []

    def fake_main(argv: list[str], clock: object) -> int:
        calls.append((argv, clock))
        return 1 if "ngram" in argv else 0

    monkeypatch.setattr(throughput, "main", fake_main)
    common = ["--tag", "t2", "--results-dir", str(tmp_path), "--model", "/m", "--data-dir", "/d", "--out", str(tmp_path)]
    assert sweep.main(["run", *common, "--chunks", "6,2"]) == 1  # ngram failed
    (a6, clock6), (a2, clock2) = calls
    assert clock6 is clock2  # one run-time history for the whole command
    assert a6[a6.index("--configs") + 1] == "stock" and a6[a6.index("--output-len") + 1] == "4096"
    assert a6[a6.index("--run-id") + 1] == "sweep-t2-4096" and a2[a2.index("--run-id") + 1] == "sweep-t2-2048"
    assert a6[a6.index("--concurrency") + 1] == "1,8,32,64,128,256" and a6[a6.index("--waves") + 1] == "1"
    assert float(a2[a2.index("--time-budget") + 1]) <= 560

    for ch in sweep.chunks():
        write_result(tmp_path, ch, "t2", list(sweep.CONCURRENCY))
    calls.clear()
    assert sweep.main(["run", *common, "--next", "3"]) == 0 and calls == []


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["status", "--tag", "a/b"],
        ["run", "--tag", "t", "--model", "m", "--data-dir", "d", "--out", "o"],
        ["run", "--tag", "t", "--model", "m", "--data-dir", "d", "--out", "o", "--chunks", "99"],
        ["run", "--tag", "t", "--model", "m", "--data-dir", "d", "--out", "o", "--chunks", "x"],
        ["run", "--tag", "t", "--model", "m", "--data-dir", "d", "--out", "o", "--next", "0"],
        ["run", "--tag", "t", "--model", "m", "--data-dir", "d", "--out", "o", "--next", "1", "--chunks", "1"],
    ],
)
def test_bad_arguments_exit_with_a_message(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        sweep.parse_args(argv)
    assert e.value.code == 2


def test_throughput_waves_set_the_request_count() -> None:
    assert throughput.default_num_prompts(256, 1) == 256 and throughput.default_num_prompts(1, 1) == 4
    assert throughput.default_num_prompts(64) == 128
