"""patches/offload_capacity.py's admission on CPU: SGLang's own PrefillAdder over stand-in pools, with and without
an offloader, lending the host budget only to requests that can be parked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from sglang.srt.plugins import load_plugins

load_plugins()

from sglang_sparsespec.patches import offload, offload_capacity

from test_offload_patch import SERVED, Allocator, Mover

pytestmark = SERVED  # SGLang's PrefillAdder as the releases the pool serves have it


class Tree:
    """The radix tree surface PrefillAdder reads; ``disable`` routes ignore_eos requests to the exact simulation."""

    def __init__(self, disable):
        self.disable = disable

    def evictable_size(self):
        return 0

    def supports_mamba(self):
        return False

    def is_tree_cache(self):
        return False

    def inc_lock_ref(self, node):
        return None

    def dec_lock_ref(self, node, params=None):
        return None


class AdderReq(SimpleNamespace):
    """The Req surface PrefillAdder.add_one_req reads and writes."""

    def needs_host_load_back(self):
        return False

    def set_extend_range(self, start, end):
        self.extend_range = SimpleNamespace(start=start, end=end, length=end - start)


def _adder_req(rid, prompt, max_new, generated=0, ignore_eos=True, **unparkable):
    out = list(range(generated))
    sampling = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}
    sampling.update((k, unparkable.pop(k)) for k in list(unparkable) if k in sampling)
    # What parkable() reads (a request in the waiting queue: not finished, nothing in flight).
    state = {
        "to_finish": None,
        "grammar": None,
        "custom_logit_processor": None,
        "multimodal_inputs": None,
        "return_hidden_states": False,
        "inflight_middle_chunks": 0,
        "finished": lambda: False,
        **unparkable,
    }
    return AdderReq(
        rid=rid,
        origin_input_ids=list(range(prompt)),
        output_ids=out,
        full_untruncated_fill_ids=list(range(prompt)) + out,
        prefix_indices=[],
        sampling_params=SimpleNamespace(ignore_eos=ignore_eos, max_new_tokens=max_new, **sampling),
        retracted_stain=False,
        mamba_pool_idx=None,
        host_hit_length=0,
        last_node=None,
        **state,
    )


@pytest.fixture
def admission(monkeypatch):
    """A real PrefillAdder over a 1000-token pool whose 4 running requests will grow 400 tokens each."""
    from sglang.srt.managers import schedule_policy

    monkeypatch.setattr(schedule_policy, "is_dsa_prefill_cp_in_seq_split", lambda: False)
    monkeypatch.setattr(schedule_policy, "is_prefill_context_parallel_enabled", lambda: False)
    running = SimpleNamespace(
        reqs=[_adder_req(f"r{i}", 100, 500, generated=100) for i in range(4)], batch_size=lambda: 4
    )

    def make(free=1000, radix=False, host=None, chunk=None):
        monkeypatch.setattr(offload, "_ACTIVE", None)
        if host is not None:
            mover = Mover(8, host)
            off = offload.KVOffloader(SimpleNamespace(), mover, decode_reserve=1)
            monkeypatch.setattr(offload, "_ACTIVE", off)
        return schedule_policy.PrefillAdder(1, Tree(disable=not radix), Allocator(free), running, 0.7, 16384, chunk)

    return SimpleNamespace(make=make, AddReqResult=schedule_policy.AddReqResult)


# The exact ignore_eos simulation (radix off); the new_token_ratio estimate (radix on, or not ignore_eos).
@pytest.mark.parametrize("radix,ignore_eos", [(False, True), (True, True), (False, False)])
def test_admission_counts_free_host_tokens_only_with_an_offloader(admission, radix, ignore_eos):
    ok, no = admission.AddReqResult.CONTINUE, admission.AddReqResult.NO_TOKEN
    # Running demand 4 x 400 (exact) or 4 x 280 (ratio 0.7) exceeds 1000 free tokens: stock queues the request.
    adder = admission.make(radix=radix)
    assert (
        adder.add_one_req(_adder_req("new", 100, 500, ignore_eos=ignore_eos), False, None) == no
        and not adder.can_run_list
    )
    # With an offloader, the demand fits GPU + host free tokens: admitted, and the lent slack is returned.
    adder = admission.make(radix=radix, host=10_000)
    before = (adder.rem_total_token_offset, adder.cur_rem_token_offset)
    assert adder.add_one_req(_adder_req("new", 100, 500, ignore_eos=ignore_eos), False, None) == ok
    assert [r.rid for r in adder.can_run_list] == ["new"]
    assert (adder.rem_total_token_offset, adder.cur_rem_token_offset) == (before[0] + 100 + 500 + 1, before[1] + 101)
    # Host full (or too small for the overshoot): SGLang's own rule.
    adder = admission.make(radix=radix, host=300)
    assert adder.add_one_req(_adder_req("new", 100, 500, ignore_eos=ignore_eos), False, None) == no


@pytest.mark.parametrize(
    "unparkable",
    [
        {"frequency_penalty": 0.5},
        {"repetition_penalty": 1.1},
        {"min_new_tokens": 4},
        {"grammar": object()},
        {"custom_logit_processor": "serialized"},
        {"return_hidden_states": True},
    ],
)
def test_admission_lends_the_host_budget_only_to_requests_that_can_be_parked(admission, unparkable):
    """A request the pool can never park would be retracted and recomputed when the GPU runs out, where
    SGLang's own admission queues it: it is admitted by SGLang's rule alone."""
    adder = admission.make(host=10_000)
    req = _adder_req("new", 100, 500, **unparkable)
    assert adder.add_one_req(req, False, None) == admission.AddReqResult.NO_TOKEN and not adder.can_run_list
    adder = admission.make(host=10_000)  # the same request without what keeps it from being parked
    assert adder.add_one_req(_adder_req("new", 100, 500), False, None) == admission.AddReqResult.CONTINUE


def test_admission_slack_excludes_parked_growth_and_never_funds_the_prefill(admission):
    no = admission.AddReqResult.NO_TOKEN
    adder = admission.make(host=10_000)
    # A parked request that will still grow 9,900 tokens leaves too little host for the new demand.
    parked = _adder_req("parked", 100, 10_000, generated=100)
    offload._ACTIVE.rows[id(parked)] = SimpleNamespace(req=parked)
    assert offload_capacity.admission_slack(offload._ACTIVE, 6) == 10_000 - 9_900 - 6
    assert adder.add_one_req(_adder_req("new", 100, 500), False, None) == no
    adder = admission.make(host=10_000)  # the same without the parked request: admitted
    assert adder.add_one_req(_adder_req("new", 100, 500), False, None) == admission.AddReqResult.CONTINUE
    # The prefill itself (100 tokens + a page) must fit the GPU now, whatever the host holds.
    for free, admitted in ((100, False), (101, True)):
        adder = admission.make(free=free, host=10_000)
        adder.add_one_req(_adder_req("new", 100, 500), False, None)
        assert bool(adder.can_run_list) is admitted
    # A prompt that would be chunked needs GPU memory later that parking does not make: SGLang's rule.
    for chunk, admitted in ((99, False), (100, True)):
        adder = admission.make(host=10_000, chunk=chunk)
        adder.add_one_req(_adder_req("new", 100, 500), False, None)
        assert bool(adder.can_run_list) is admitted
