"""The report's pages: docs/results.md, the pages under docs/results/ and the README's headline are what the
report makes of the checked-in results, and a rerun keeps the hand-written text around its markers."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

# benchmarks/ is a folder at the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report
from bench_fakes import cli


def _generated_pages(folder: Path) -> dict[str, str]:
    """The report's pages in ``folder`` (hand-written pages there, like history.md, do not start with its note)."""
    note = report.PAGE_NOTE.format(readme="results.md")
    return {f.name: f.read_text() for f in sorted(folder.glob("*.md")) if f.read_text().startswith(note)}


def test_report_regenerates_the_results_page_from_the_checked_in_results(tmp_path: Path) -> None:
    """docs/results.md's index and headline blocks, the table pages in docs/results/ and the README's headline
    block are what the report makes of benchmarks/results: no number by hand, no page left over or missing."""
    repo = Path(__file__).resolve().parents[1]
    page, front = tmp_path / "results.md", tmp_path / "README.md"
    page.write_text((repo / "docs" / "results.md").read_text())
    front.write_text((repo / "README.md").read_text())
    common = dict(results_dir=repo / "benchmarks" / "results", out=tmp_path / "S.md", no_plots=True)
    assert report.main(cli(**common, readme=page, front_page=front)) == 0
    assert page.read_text() == (repo / "docs" / "results.md").read_text()
    assert front.read_text() == (repo / "README.md").read_text()
    # The README's one results table: the headline point, every stock backend of its run beside PILLAR.
    headline = front.read_text().split(report.HEADLINE_BEGIN)[1].split(report.HEADLINE_END)[0]
    assert "**SmolLM2-135M-Instruct on one NVIDIA H100 80GB HBM3, commit 58858b1**" in headline
    assert "(run `h100-58858b1-match`" in headline
    assert "| `stock` | triton | 23,142 | 1.00x | 77.0 | 10.97 | - |" in headline
    assert "| `stock-flashinfer` | flashinfer | 21,690 | 0.94x | 82.4 | 11.70 | - |" in headline
    assert "| `pillar` | triton | 50,036 | **2.16x** | 33.3 | 4.53 | 5.75 |" in headline
    assert (
        "`benchmarks/results/throughput/throughput_h100-58858b1-match_{stock,stock-flashinfer,pillar}.json`" in headline
    )
    assert "](docs/figures/throughput_vs_concurrency.png)" in headline and "runs `sweep-e058028-*`" in headline
    assert "](../docs/figures/throughput_vs_concurrency.png)" in page.read_text()  # the same figure from docs/
    assert headline.count("|") == 5 * 8 and len(headline) < 2_000  # one table: its head, rule and three rows
    made, checked_in = _generated_pages(tmp_path / "results"), _generated_pages(repo / "docs" / "results")
    assert set(made) == {p.file for p in report.results_pages([])} == set(checked_in)  # every kind has results
    assert made == checked_in
    index = page.read_text().split(report.README_BEGIN)[1].split(report.README_END)[0]
    assert sorted(re.findall(r"\]\(results/([\w.-]+)\)", index)) == sorted(made)
    assert len(index.strip().split("\n")) == len(made)  # one line per page
    assert "- [Throughput](results/throughput.md): single runs" in index
    step_runs = [
        f
        for f in (repo / "benchmarks" / "results" / "step_times").glob("*.json")
        if json.loads(f.read_text()).get("kind") == "step_times"
    ]
    runs = re.search(r"\[Step times\]\(results/step-times\.md\):.*; (\d+) runs\.", index).group(1)
    assert runs == str(len(step_runs))
    assert "sampled-3dc3540-7000" in made["throughput.md"] and "sweep-85d9722" not in made["throughput.md"]
    assert "| pillar | 256 | 512 | 39247 | 1.72x | 1.72x | 2.06x |" in made["throughput.md"]  # the headline
    # Against the best stock backend of its point: stock FlashInfer alone in that run.
    assert "| pillar-flashinfer | 256 | 512 | 53359 | - | 1.10x |" in made["throughput.md"]
    assert "| stock-flashinfer | 256 | 512 | 21957 | 0.96x | 0.96x |" in made["throughput.md"]
    assert "temperature 0.6, top-p 0.95; stream interval 8" in made["throughput.md"]
    assert "## Run-to-run spread" in made["throughput-sweep.md"]
    # The offload table: ratios against the pressured stock of the same file, the verdict vs the reference.
    assert (
        "| pillar_offload | ok | 18676 | 1.68x | 0 | 16 / 16 | 1.53 GB | 1.53 GB | PASS (8/64 identical) |"
        in made["offload.md"]
    )
    assert "| reference | ok | 8969 | 0.81x | 0 | - | - | - | - |" in made["offload.md"]
    assert "\n## Losslessness (greedy token ids vs stock)\n" in made["acceptance-and-lossless.md"]
    for body in made.values():  # one title, then sections one level below it
        heads = [line.split(" ")[0] for line in body.split("\n") if line.startswith("#")]
        assert heads.count("#") == 1 and heads[0] == "#" and heads[1] == "##", heads[:3]
    assert len(page.read_text().encode()) < 40_000  # the reading stays short; the tables are on the pages
    summary = (tmp_path / "S.md").read_text()
    # Ratios only against the stock rows of the same run: the budget run has no stock, so no ratio.
    assert "| pillar | 256 | 512 | 37380 | 1.65x | 1.65x | 1.97x |" in summary
    assert "| pillar:budget_ratio=0.1 | 1 | 4 | 549 | - | - |" in summary
    for section in ("### Kernel launch sweep", "### Draft policies in the CPU reference", "### Run-to-run spread"):
        assert section in summary
    # The pages hold every table of the summary but the runs bounded by streaming: no SUMMARY.md is checked in.
    on_pages = {h.lstrip("#") for body in made.values() for h in re.findall(r"^#+ .*$", body, re.M)}
    in_summary = {h.lstrip("#") for h in re.findall(r"^#{3,} .*$", summary, re.M)}
    assert in_summary - on_pages == {" Throughput, run h100-e2aee79-2k"}  # stream interval 1
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="results:begin"):
        report.main(cli(**common, readme=page))
    front.write_text("no markers\n")
    with pytest.raises(SystemExit, match="headline:begin"):
        report.main(cli(**common, front_page=front))


def test_report_writes_one_page_per_kind_and_keeps_the_hand_written_text(tmp_path: Path) -> None:
    """--readme writes the pages of the kinds present into <readme stem>/, the index between the markers only,
    removes a page it wrote whose kind is gone, never touches hand-written pages, and a rerun changes nothing."""
    src = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    results = tmp_path / "results_in"
    results.mkdir()
    for name in (
        "throughput/throughput_sampled-8f4fce1-7000_stock.json",
        "throughput/throughput_sampled-8f4fce1-7000_pillar.json",
        "lossless/lossless_k8_split.json",
        "step_times/steps_smollm2_h100_sampled_8f4fce1.json",
    ):
        shutil.copy(src / name, results / Path(name).name)
    pages = tmp_path / "docs" / "results"
    pages.mkdir(parents=True)
    head = "# Results\n\nHand-written reading, [history](results/history.md).\n\n"
    middle = "\n\nThe tables:\n\n"
    tail = "\n\n## A reading\n\nMore hand-written text.\n"
    readme = tmp_path / "docs" / "results.md"
    old_headline = f"{report.HEADLINE_BEGIN}\nold headline\n{report.HEADLINE_END}"
    old_index = f"{report.README_BEGIN}\nold tables\n{report.README_END}"
    readme.write_text(head + old_headline + middle + old_index + tail)
    note = report.PAGE_NOTE.format(readme="results.md")
    (pages / "history.md").write_text("# History\n\nkept as is\n")
    (pages / "kernels.md").write_text(note + "\n\nan old generated page\n")
    (pages / "throughput-sweep.md").write_text("a hand-written page of a generated name is kept\n")
    argv = ["--results-dir", str(results), "--out", str(tmp_path / "S.md"), "--no-plots", "--readme", str(readme)]
    assert report.main(argv) == 0
    text = readme.read_text()
    assert text.startswith(head + report.HEADLINE_BEGIN + "\n") and text.endswith(report.README_END + tail)
    assert report.HEADLINE_END + middle + report.README_BEGIN in text
    assert "old tables" not in text and "old headline" not in text
    # These files hold no run with every stock backend beside PILLAR: the headline says so, the figure is missing.
    assert text.split(report.HEADLINE_BEGIN)[1].split(report.HEADLINE_END)[0] == (
        "\n\nNo run holds a sampled two-wave point with `pillar` and every stock backend (stock, stock-flashinfer) "
        "yet.\n\n"
    )
    written = {"throughput.md", "acceptance-and-lossless.md", "step-times.md"}
    assert {f.name for f in pages.iterdir()} == written | {"history.md", "throughput-sweep.md"}  # kernels.md removed
    assert (pages / "history.md").read_text() == "# History\n\nkept as is\n"
    index = text.split(report.README_BEGIN)[1].split(report.README_END)[0].strip().split("\n")
    links = [re.fullmatch(r"- \[[^]]+\]\(results/([\w.-]+)\): .+; .+\.", line) for line in index]
    assert all(links) and [m.group(1) for m in links] == [
        "throughput.md",
        "acceptance-and-lossless.md",
        "step-times.md",
    ]
    assert index[0].endswith("; 1 run.")
    assert index[1].endswith(
        "; 1 lossless run, 0 acceptance runs, 0 exactness runs, 0 policy_sim runs, 0 draft_fidelity runs."
    )
    for name in written:
        first, rest = (pages / name).read_text().split("\n", 1)
        assert first == note and "`python -m benchmarks.report --readme docs/results.md`" in first
        assert rest.startswith("\n# ")
    assert "| pillar | 256 | 512 | 37757 | 1.66x | 1.66x | 2.10x |" in (pages / "throughput.md").read_text()
    assert "## Step times, run 20261125-072548" in (pages / "step-times.md").read_text()
    # A rerun is idempotent, and a generated page edited by hand is written over.
    before = {f.name: f.read_text() for f in [readme, *pages.iterdir()]}
    (pages / "step-times.md").write_text("edited by hand\n")
    assert report.main(argv) == 0
    assert {f.name: f.read_text() for f in [readme, *pages.iterdir()]} == before
    # Hand-written text changed outside the markers survives a rerun as is.
    readme.write_text(text.replace("More hand-written text.", "Changed by hand."))
    assert report.main(argv) == 0
    assert readme.read_text() == text.replace("More hand-written text.", "Changed by hand.")


def test_the_exactness_table_judges_a_run_without_its_power_check_at_the_parity_threshold() -> None:
    """A run whose power check was cut by its time budget has no verdict threshold: its rows are judged at the
    parity comparison's, the verdict column carries the parity verdict, and a missing control p reads '-'."""
    from benchmarks.report.correctness import exactness_markdown

    test = {"temperature": 0.6, "top_p": 0.95, "context": 0, "df": 9, "stat": 70.0}
    doc = {
        "kind": "exactness",
        "_file": "exactness_x.json",
        "meta": {"run_id": "r", "git_commit": "abc1234"},
        "settings": {"candidate": "pillar", "reference": "stock"},
        "tests": [{**test, "position": "token 2", "p_value": 0.4}, {**test, "position": "token 3", "p_value": 1e-11}],
        "control": None,
        "verdict": "INCOMPLETE",
        "bonferroni_threshold": None,
        "parity": {"threshold": 1e-4, "verdict": "WITHIN"},
    }
    rows = [line for line in exactness_markdown([doc]).splitlines() if line.startswith("| exactness_x.json")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [c[-3:] for c in cells] == [
        ["-", "passes", "INCOMPLETE; parity WITHIN"],
        ["-", "rejects", "INCOMPLETE; parity WITHIN"],
    ]


def test_the_fidelity_table_says_which_tokens_fed_the_scoring_verify_rows() -> None:
    """Runs that fed the verify the reference past the committed tokens read 'reference'; the served tail 'served'."""
    from benchmarks.report.correctness import draft_fidelity_markdown

    settings = {
        "source": "aime24:1",
        "advance": 6,
        "budget_ratio": 0.05,
        "min_budget": 128,
        "recent_window": 64,
        "select_every": 8,
        "temperature": 0.6,
        "top_p": 0.95,
    }
    result = {"mean_expected_tokens": 6.5, "mean_accept_prob_by_position": [0.9], "mean_draft_set": 160, "rounds": 3}
    docs = [
        {
            "kind": "draft_fidelity",
            "_file": f"draft_fidelity_{name}.json",
            "settings": {**settings, **extra},
            "reference_kind": "written solution",
            "reference_ids": [1, 2, 3],
            "results": {"pillar": result},
        }
        for name, extra in (("old", {}), ("new", {"verify_tail": "served"}))
    ]
    rows = [line for line in draft_fidelity_markdown(docs).splitlines() if line.startswith("| draft_fidelity_")]
    cells = {c[0]: c for c in ([x.strip() for x in row.strip("|").split("|")] for row in rows)}
    assert cells["draft_fidelity_old.json"][10:12] == ["reference", "pillar"]
    assert cells["draft_fidelity_new.json"][10:12] == ["served", "pillar"]
