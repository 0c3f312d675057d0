"""Wall-time guesses for benchmark runs and server starts, from what was measured, so that a server is
not started (and a run not launched) when the time budget cannot cover it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.configs import stream_interval

START_GUESS_FLOOR_S = 90.0  # floor of the server-start guess (a start takes 60-140 s warm, up to 240 s on a fresh node)
MIN_RUN_S = 20.0  # the guess for a run shape never measured
RUN_MARGIN = 1.3  # a config may be slower than the slowest one measured so far at the same shape

# A run's wall time outside bench_serving's timed window (tokenizer and dataset load, one 32-token
# warmup request, a 1 s sleep, metrics); the module import is paid once per driver, not per run.
RUN_OVERHEAD_S = 10.0


def gpu_model(device: str | None) -> str | None:
    """``NVIDIA H200, 143771 MiB, 580.159.04`` (``device_name()``) -> ``NVIDIA H200``."""
    return device.split(",")[0].strip() if device else None


def config_family(name: str) -> str:
    """``pillar-k4-coarse:budget_ratio=0.1`` -> ``pillar``; ``stock-flashinfer`` -> ``stock``."""
    return name.split(":")[0].split("-")[0]


@dataclass
class RunClock:
    """Wall-time guesses from measured history, so that a server is not started (and a bench not
    launched) when the budget cannot cover it: a run cut short by the budget is wasted device time.
    ``rates[(config, c, n)]``: slowest output tok/s over bench_serving's own timed window (``duration``) of a
    finished run at concurrency ``c`` with ``n`` output tokens per request (the window, not the wall
    time, so results from before the bench driver, which paid a 26 s import per run, still apply);
    ``starts[family]``: slowest server start of a config family (``config_family``) so far."""

    rates: dict[tuple[str, int, int], float] = field(default_factory=dict)
    starts: dict[str, float] = field(default_factory=dict)

    @classmethod
    def seeded(cls, docs: Iterable[dict[str, Any]], device: str | None = None) -> RunClock:
        """A clock holding the run times of the throughput results among ``docs`` (any run id) that
        streamed in chunks: at stream interval 1 the HTTP path, not decoding, set the pace. With ``device``
        (``device_name()``), only the results of that GPU model when there are any: an H100's slower stock
        runs planned an H200's 256 x 7K stock run at 270 s where it took ~150, and the run was skipped with
        320 s left. Server starts are not seeded: a warm node starts a server in 60-140 s, a fresh one in up
        to 240 s, and a command knows which it is only from its own starts."""
        docs = [d for d in docs if d.get("kind") == "throughput"]
        same = [
            d for d in docs if device is not None and gpu_model(d.get("meta", {}).get("device")) == gpu_model(device)
        ]
        clock = cls()
        for doc in same or docs:
            if stream_interval(doc["config"]["flags"]) <= 1:
                continue
            for r in doc["runs"]:
                m = r.get("metrics") or {}
                if r["status"] == "ok" and m.get("duration"):
                    clock.record_run(
                        doc["config"]["name"],
                        r["concurrency"],
                        doc["workload"]["output_len"],
                        m["total_output_tokens"],
                        m["duration"],
                    )
        return clock

    def rate(self, config: str, concurrency: int, output_len: int) -> float | None:
        """Output tok/s to plan with, from pools of runs of this length: the config itself, its family
        (``pillar-coarse`` -> every ``pillar*``; a variant runs the same worker), then every config. NGRAM's
        7K runs take 2.5x PILLAR's, so a PILLAR variant guessed from them would never fit a command. Within
        a pool the slowest run of the shape counts; an unmeasured concurrency gets at most twice the rate of
        the nearest measured lower one: doubling the batch at best doubles the rate, so the guess errs long
        (a 256 x 7K run launched on the flat MIN_RUN_S guess with 78 s left was cut). The pool measured
        nearest below ``concurrency`` wins, the narrower on a tie: a variant's own c=1 run doubled six times
        guessed its 64 x 7K run at 650 s where its family's 64 x 7K runs took 34 s, and the run was skipped."""
        family = config_family(config)
        best: tuple[int, float] | None = None
        for member in (lambda name: name == config, lambda name: config_family(name) == family, lambda name: True):
            pool: dict[int, float] = {}
            for (name, c, n), rate in self.rates.items():
                if n == output_len and c <= concurrency and member(name):
                    pool[c] = min(rate, pool.get(c, rate))
            c = max(pool, default=0)
            if c and (best is None or c > best[0]):
                best = (c, pool[c] * min(concurrency / c, 2.0))
        return None if best is None else best[1]

    def run_s(self, config: str, concurrency: int, output_len: int, num_prompts: int) -> float | None:
        """Expected wall time of a run; None before any run of this length at this or a lower concurrency finished."""
        rate = self.rate(config, concurrency, output_len)
        return None if rate is None else RUN_MARGIN * num_prompts * output_len / rate + RUN_OVERHEAD_S

    def guess_s(self, config: str, concurrency: int, output_len: int, num_prompts: int) -> float:
        expected = self.run_s(config, concurrency, output_len, num_prompts)
        return MIN_RUN_S if expected is None else expected

    def record_run(self, config: str, concurrency: int, output_len: int, output_tokens: int, duration_s: float) -> None:
        rate = output_tokens / duration_s
        key = (config, concurrency, output_len)
        self.rates[key] = min(rate, self.rates.get(key, rate))

    def startup_guess(self, config: str) -> float:
        """The slowest start of the config's family in this command, else the floor. Per family: a
        stock start paying FlashInfer's JIT (245 s on the H100 at ce113f5) said nothing of the PILLAR
        start after it (94 s), yet skipped it; and a skip wastes the rest of the budget, where a start
        that runs out of it still fills the JIT caches the next command starts from."""
        return self.starts.get(config_family(config), START_GUESS_FLOOR_S)

    def record_start(self, config: str, seconds: float) -> None:
        family = config_family(config)
        self.starts[family] = max(self.starts.get(family, START_GUESS_FLOOR_S), seconds)
