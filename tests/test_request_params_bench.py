"""benchmarks/checks/request_params.py's verdicts, on canned /generate replies (no server)."""

from __future__ import annotations

from benchmarks.checks import request_params as rp

REF = [5, 6, 7, 8, 9, 10, 11, 12]


def fake_servers(pillar_reply):
    def generate(url, text, sampling, **extra):
        if "stop_token_ids" not in sampling:  # stock's greedy reference
            return {"output_ids": REF, "meta_info": {"finish_reason": {"type": "length"}}}
        if url == "stock":
            return {"output_ids": REF[:5], "meta_info": {"finish_reason": {"type": "stop", "matched": REF[4]}}}
        return pillar_reply

    return generate


def test_stop_then_length_fails_a_run_kept_past_the_stop(monkeypatch):
    monkeypatch.setattr(rp, "PROMPTS", ["p"])
    bad = {"output_ids": REF[:8], "meta_info": {"finish_reason": {"type": "length", "length": 8}}}
    monkeypatch.setattr(rp, "generate", fake_servers(bad))
    assert not rp.check_stop_then_length("stock", "pillar")["pass"]
    good = {"output_ids": REF[:5], "meta_info": {"finish_reason": {"type": "stop", "matched": REF[4]}}}
    monkeypatch.setattr(rp, "generate", fake_servers(good))
    assert rp.check_stop_then_length("stock", "pillar")["pass"]


def test_first_divergence():
    assert rp.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert rp.first_divergence([1, 2, 3], [1, 4, 3]) == 1
    assert rp.first_divergence([1, 2, 3], [1, 2]) == 2
