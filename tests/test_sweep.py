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
    runs = [{"concurrency": c, "status": "ok" if c in ok else "failed", "wall_s": 1.0,
             "metrics": {"total_output_tokens": 1000, "duration": 1.0}} for c in sweep.CONCURRENCY]  # fmt: skip
    doc = {"kind": "throughput", "config": {"name": chunk.config, "flags": ["--stream-interval", "8"]},
           "workload": {"output_len": chunk.output_len}, "runs": runs}  # fmt: skip
    chunk.result_file(tag, results).write_text(json.dumps(doc))


def test_chunks_cover_the_matrix_config_first_stock_first() -> None:
    table = sweep.chunks()
    assert len(table) == len(sweep.OUTPUT_LENS) * len(sweep.CONFIGS)
    assert [ch.index for ch in table] == list(range(len(table)))
    assert {(ch.output_len, ch.config) for ch in table} == {(n, c) for n in sweep.OUTPUT_LENS for c in sweep.CONFIGS}
    assert [ch.config for ch in table[: len(sweep.OUTPUT_LENS)]] == ["stock"] * len(sweep.OUTPUT_LENS)
    assert [ch.output_len for ch in table[: len(sweep.OUTPUT_LENS)]] == list(sweep.OUTPUT_LENS)
    ch = table[0]
    assert ch.run_id("abc1234") == "sweep-abc1234-2048"
    assert ch.result_file("abc1234", Path("/r")) == Path("/r/throughput_sweep-abc1234-2048_stock.json")


def test_status_and_next(tmp_path: Path) -> None:
    table = sweep.chunks()
    write_result(tmp_path, table[0], "t1", list(sweep.CONCURRENCY))
    write_result(tmp_path, table[1], "t1", [8])
    write_result(tmp_path, table[2], "other", list(sweep.CONCURRENCY))  # another tag does not count
    assert sweep.chunk_state(table[0], "t1", tmp_path) == ("done", list(sweep.CONCURRENCY))
    assert sweep.chunk_state(table[1], "t1", tmp_path) == ("partial", [8])
    assert sweep.chunk_state(table[2], "t1", tmp_path) == ("missing", [])
    md = sweep.status_table("t1", tmp_path)
    assert "| 0 | 2048 | stock | done | 1 8 32 64 128 256 | " in md and "| 1 | 4096 | stock | partial | 8 | " in md
    assert "| 2 | 7000 | stock | missing | - | " in md
    # 17 chunks are not done; the 4096 ones cannot be estimated: c=1 has no run at that length, nor a lower
    # concurrency to guess from (the other tag's 7000 runs count as history).
    last = md.splitlines()[-1]
    assert last.startswith(f"{len(table) - 1} chunks to go over {len(sweep.CONFIGS)} configs: about ")
    assert f"({len(sweep.CONFIGS)} chunks not estimated)" in last and last.endswith("per config and per command")
    args = sweep.parse_args(["run", "--tag", "t1", "--results-dir", str(tmp_path), "--model", "m", "--data-dir", "d",
                             "--out", "o", "--next", "2"])  # fmt: skip
    assert [ch.index for ch in sweep.pick(args)] == [1, 2]  # the partial chunk is run again
    # A slice: 7000 only, two configs. --next walks the slice in matrix order; status shows only its rows.
    args = sweep.parse_args(["run", "--tag", "t1", "--results-dir", str(tmp_path), "--model", "m", "--data-dir", "d",
                             "--out", "o", "--next", "3", "--lens", "7000", "--configs", "pillar-streaming,stock"])  # fmt: skip
    assert [(ch.output_len, ch.config) for ch in sweep.pick(args)] == [(7000, "stock"), (7000, "pillar-streaming")]
    write_result(tmp_path, table[2], "t1", list(sweep.CONCURRENCY))
    assert [ch.config for ch in sweep.pick(args)] == ["pillar-streaming"]
    md = sweep.status_table("t1", tmp_path, sweep.selected([7000], ["stock", "pillar-streaming"]))
    rows = [line for line in md.splitlines() if line.startswith("| ") and "chunk" not in line]
    assert [r.split(" | ")[1:4] for r in rows] == [["7000", "stock", "done"], ["7000", "pillar-streaming", "missing"]]
    assert md.splitlines()[-1].startswith("1 chunks to go over 1 configs")


def test_run_hands_each_server_group_to_throughput(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], object]] = []

    def fake_main(argv: list[str], clock: object) -> int:
        calls.append((argv, clock))
        return 1 if "ngram" in argv else 0

    monkeypatch.setattr(throughput, "main", fake_main)
    for n in (4096, 7000):  # history: each run's window is 5 s, so a 4K + 7K group fits the budget
        tp_result(tmp_path / f"throughput_hist-{n}_stock.json", n, ["--stream-interval", "8"],
                  [(c, throughput.default_num_prompts(c, 1) * n, 5.0) for c in sweep.CONCURRENCY])  # fmt: skip
    common = ["--tag", "t2", "--results-dir", str(tmp_path), "--model", "/m", "--data-dir", "/d", "--out", str(tmp_path)]
    table = sweep.chunks()
    pillar = [ch.index for ch in table if ch.config == "pillar" and ch.output_len != 2048]
    ngram = [ch.index for ch in table if ch.config == "ngram"][0]
    chosen = [*pillar, ngram]
    assert sweep.main(["run", *common, "--chunks", ",".join(map(str, chosen))]) == 1  # ngram failed
    (a1, clock1), (a2, clock2) = calls
    assert clock1 is clock2  # one run-time history for the whole command
    # The two PILLAR chunks share one server start; the ngram chunk gets its own.
    assert a1[a1.index("--configs") + 1] == "pillar" and a1[a1.index("--output-len") + 1] == "4096,7000"
    assert a1[a1.index("--run-id") + 1] == "sweep-t2-{output_len}"
    assert a1[a1.index("--log-name") + 1] == "throughput_sweep-t2-4096-7000_pillar.log"
    assert a2[a2.index("--configs") + 1] == "ngram" and a2[a2.index("--output-len") + 1] == "2048"
    assert a1[a1.index("--concurrency") + 1] == "1,8,32,64,128,256" and a1[a1.index("--waves") + 1] == "1"
    assert float(a2[a2.index("--time-budget") + 1]) <= 560
    # The run id template gives each length the chunk's own result file.
    assert throughput.run_id_for("sweep-t2-{output_len}", [7000]) == table[pillar[1]].run_id("t2")

    assert "--resume" not in a1  # --chunks measures whole chunks

    # A partial chunk is planned by its missing runs only: 7K stock with 5 of 6 runs done needs one run.
    seven_k = next(ch for ch in table if ch.config == "stock" and ch.output_len == 7000)
    write_result(tmp_path, seven_k, "t2", [c for c in sweep.CONCURRENCY if c != 256])
    clock = throughput.RunClock.seeded(tmp_path)
    one = sweep.chunk_s(clock, seven_k, [256])
    assert one is not None and one < sweep.chunk_s(clock, seven_k) / 3
    assert f"| {seven_k.index} | 7000 | stock | partial | 1 8 32 64 128 | {one:.0f} |" in sweep.status_table("t2", tmp_path)
    start = clock.startup_s + throughput.STOP_RESERVE_S
    assert sweep.fitting_prefix(clock, [seven_k], start + one + 1, {seven_k.index: [256]}) == [seven_k]
    assert sweep.fitting_prefix(clock, [seven_k], start + one + 1) == []  # without todo: all six runs
    assert sweep.fitting_prefix(clock, [seven_k], start + one - 1, {seven_k.index: [256]}) == []
    calls.clear()
    assert sweep.main(["run", *common, "--next", "3"]) == 0
    (argv, _), = calls  # stock 2K, 4K and the partial 7K: one server group, resumed from the results
    assert argv[argv.index("--output-len") + 1] == "2048,4096,7000" and argv[argv.index("--resume") + 1] == str(tmp_path)

    for ch in sweep.chunks():
        write_result(tmp_path, ch, "t2", list(sweep.CONCURRENCY))
    calls.clear()
    assert sweep.main(["run", *common, "--next", "3"]) == 0 and calls == []


def tp_result(path: Path, output_len: int, flags: list[str], runs: list[tuple[int, int, float]]) -> None:
    """A throughput JSON of the config its name ends with, with (concurrency, output tokens, bench duration s) ok runs."""
    doc = {"kind": "throughput", "config": {"name": path.stem.rsplit("_", 1)[1], "flags": flags}, "workload": {"output_len": output_len},
           "runs": [{"concurrency": c, "status": "ok", "wall_s": w + 26.0,
                     "metrics": {"total_output_tokens": t, "duration": w}} for c, t, w in runs]}  # fmt: skip
    path.write_text(json.dumps(doc))


def test_seeded_clock_cuts_a_group_to_what_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 7000-token runs at stream interval 8: every concurrency's timed window is 50 s (one wave, the sweep's count).
    runs = [(c, throughput.default_num_prompts(c, 1) * 7000, 50.0) for c in sweep.CONCURRENCY]
    tp_result(tmp_path / "throughput_a_stock.json", 7000, ["--stream-interval", "8"], runs)
    # Stream interval 1 was paced by the HTTP path: ignored.
    tp_result(tmp_path / "throughput_b_stock.json", 7000, [], [(c, t, 10 * w) for c, t, w in runs])
    clock = throughput.RunClock.seeded(tmp_path)
    table = sweep.chunks()
    stock = [ch for ch in table if ch.config == "stock"]
    seven_k = table[-1]
    assert seven_k.output_len == 7000 and [ch.output_len for ch in stock] == [2048, 4096, 7000]
    runs_s = 6 * (throughput.RUN_MARGIN * 50.0 + throughput.RUN_OVERHEAD_S)  # the wall time, not the window, counts
    assert sweep.chunk_s(clock, seven_k) == pytest.approx(runs_s)
    assert sweep.chunk_s(clock, stock[0]) is None  # no 2K history
    start = throughput.START_GUESS_FLOOR_S + throughput.STOP_RESERVE_S
    assert sweep.fitting_prefix(clock, [seven_k], start + runs_s + 1) == [seven_k]
    assert sweep.fitting_prefix(clock, [seven_k], start + runs_s - 1) == []
    # An unknown chunk is tried only first in its group: 2K goes, unknown 4K stops the group there.
    assert sweep.fitting_prefix(clock, stock, 10_000) == stock[:1]
    assert sweep.fitting_prefix(clock, stock[1:], 10_000) == stock[1:]

    started: list[list[str]] = []
    monkeypatch.setattr(throughput, "main", lambda argv, clock: started.append(argv) or 0)
    common = ["--tag", "t3", "--results-dir", str(tmp_path), "--model", "/m", "--data-dir", "/d", "--out", str(tmp_path)]
    # ~580 s needed for the 7K chunk with its server start: not started; the 2K chunk (unknown) is.
    assert sweep.main(["run", *common, "--chunks", f"{seven_k.index},{stock[0].index}", "--time-budget", "560"]) == 0
    (argv,) = started
    assert argv[argv.index("--configs") + 1] == "stock" and argv[argv.index("--output-len") + 1] == "2048"
    assert "--resume" not in argv  # --chunks measures whole chunks


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
        ["run", "--tag", "t", "--model", "m", "--data-dir", "d", "--out", "o", "--next", "1", "--lens", "1000"],
        ["run", "--tag", "t", "--model", "m", "--data-dir", "d", "--out", "o", "--next", "1", "--lens", "x"],
        ["run", "--tag", "t", "--model", "m", "--data-dir", "d", "--out", "o", "--next", "1", "--configs", "eagle"],
        ["run", "--tag", "t", "--model", "m", "--data-dir", "d", "--out", "o", "--chunks", "1", "--lens", "7000"],
        ["status", "--tag", "t", "--configs", ","],
    ],
)
def test_bad_arguments_exit_with_a_message(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        sweep.parse_args(argv)
    assert e.value.code == 2


def test_throughput_waves_set_the_request_count() -> None:
    assert throughput.default_num_prompts(256, 1) == 256 and throughput.default_num_prompts(1, 1) == 4
    assert throughput.default_num_prompts(64) == 128
