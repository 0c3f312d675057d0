"""A stand-in for sglang.benchmark.serving, imported by the bench driver (``cli_main`` reads sys.argv)."""

from __future__ import annotations

import json
import sys
import time
import urllib.request

print("fake bench module imported")  # must not reach the driver's protocol pipe


def cli_main():
    a = sys.argv[1:]
    get = lambda k: a[a.index(k) + 1]
    print("fake bench run", sys.argv[0], len(a), "args")
    mode = get("--fake-mode") if "--fake-mode" in a else ""
    if mode == "hang":
        time.sleep(3600)
    if mode == "raise":
        raise ValueError("fake bench failure")
    if mode == "exit":
        sys.exit(3)
    if "--dataset-path" in a:
        open(get("--dataset-path")).read()  # the harness wrote the prompt file
    urllib.request.urlopen(get("--base-url") + "/health_generate", timeout=5).read()
    n, c, out_len = int(get("--num-prompts")), int(get("--max-concurrency")), int(get("--sharegpt-output-len"))
    res = {
        "completed": n,
        "duration": 2.0,
        "total_output_tokens": n * out_len,
        "output_throughput": 100.0 * c,
        "median_tpot_ms": 5.0,
        "p99_tpot_ms": 9.0,
        "median_itl_ms": 4.0,
        "p99_itl_ms": 8.0,
        "median_ttft_ms": 30.0,
        "accept_length": 2.5 if "pillar" in get("--output-file") else None,
        "server_info": {"big": "dropped"},
    }
    if "--output-details" in a:  # per request, as bench_serving adds them (ITLs per streamed chunk)
        res.update(
            ttfts=[0.25] * n,
            itls=[[0.5, 0.25 * i] for i in range(n)],
            output_lens=[out_len] * n,
            generated_texts=["x"] * n,
            errors=[""] * n,
        )
    open(get("--output-file"), "a").write(json.dumps(res) + "\n")
