"""patches/live_rids.py: a rid live at the scheduler is not taken twice, and an abort reaches its own request.

SGLang's own ``Scheduler.abort_request`` / ``Scheduler.handle_generate_request`` (hooked by the plugin)
run on a scheduler stand-in holding real ``Req`` objects; the refusal goes back through SGLang's real
tokenizer manager and HTTP app (tests/boundary.py) to the client as a 400.
"""

from __future__ import annotations

import asyncio
import sys
import types
from array import array
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()

from boundary import make_boundary, write_model_dir  # noqa: E402
from conftest import SMOLLM2_CONFIG  # noqa: E402
from sglang_sparsespec.patches import live_rids  # noqa: E402
from sglang_sparsespec.rids import RidBook, abort_matches  # noqa: E402

from benchmarks.checks.bad_inputs import GENERATE, TEXT  # noqa: E402

VICTIM = "7f3c9e0d1a2b4c5d6e7f8091a2b3c4d5"  # another client's uuid-hex rid that starts with "7f"


@pytest.fixture(autouse=True)
def published_server_args(llama_config_dir):
    """Req reads the process's published ServerArgs, as in a scheduler process."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=str(llama_config_dir), attention_backend="triton", skip_tokenizer_init=True, device="cpu"
    )
    runtime_context.publish(args, role="test")
    yield
    runtime_context.reset_context()


def _req(rid: str):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid, "", array("q", [5, 6, 7]), SamplingParams(max_new_tokens=16))


def _sched(waiting=(), running=(), grammar=()):
    """The scheduler state SGLang's abort_request reads (no PD disaggregation, no pipeline, no dLLM, no
    encoder-disaggregated requests, no beam search, no Rust server; later releases read the last three and
    call Scheduler helpers, which are bound here where the installed release has them)."""
    from sglang.srt.constrained.grammar_manager import GrammarManager
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler

    sent: list = []
    sched = SimpleNamespace(
        chunked_req=None,
        waiting_queue=[_req(r) for r in waiting],
        enable_hicache_storage=False,
        disaggregation_mode=DisaggregationMode.NULL,
        dllm_config=None,
        ps=SimpleNamespace(pp_size=1),
        running_batch=SimpleNamespace(reqs=[_req(r) for r in running]),
        last_batch=None,
        ipc_channels=SimpleNamespace(send_to_tokenizer=SimpleNamespace(send_output=lambda msg, req: sent.append(msg))),
        mm_receiver=None,
        # PD disaggregation's queues as Scheduler.init_disaggregation leaves them outside that mode
        disagg_prefill_bootstrap_queue=None,
        disagg_prefill_inflight_queue=None,
        disagg_decode_prealloc_queue=None,
        disagg_decode_transfer_queue=None,
        rust_server=None,
        beam_coordinator=SimpleNamespace(retire_group=lambda req: None),
        enable_continuous_input_polling=False,
        result_queue=[],
        _release_aborted_request=lambda req: None,
    )
    for helper in ("send_abort_output", "collect_inflight_reqs", "_collect_inflight_batches"):
        if hasattr(Scheduler, helper):
            setattr(sched, helper, types.MethodType(getattr(Scheduler, helper), sched))
    manager = SimpleNamespace(grammar_queue=[_req(r) for r in grammar])
    manager.abort_requests = types.MethodType(GrammarManager.abort_requests, manager)
    sched.grammar_manager, sched.sent = manager, sent
    return sched


def test_abort_matches_the_rid_and_its_children_only():
    assert abort_matches("7f", "7f") and abort_matches("7f_0", "7f") and abort_matches("7f_3c9e", "7f")
    assert not abort_matches(VICTIM, "7f") and not abort_matches("7f", "7f_0") and not abort_matches("x", "")


def test_an_abort_of_7f_leaves_every_other_rid_that_starts_with_7f(monkeypatch):
    """Stock SGLang aborts every live request whose rid starts with the aborted one: with uuid-hex rids
    one character reaches a sixteenth of everyone's requests."""
    from sglang.srt.managers import schedule_batch
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.scheduler import Scheduler

    monkeypatch.setattr(schedule_batch, "get_parallel", lambda: SimpleNamespace(tp_rank=0))  # Req.set_finish_with_abort
    sched = _sched(waiting=["7f", VICTIM, "7f_a1"], running=["7fab", "7f_b2", "7f"], grammar=["7f12", "7f_c3"])
    Scheduler.abort_request(sched, AbortReq(rid="7f"))
    assert [r.rid for r in sched.waiting_queue] == [VICTIM]  # the queued 7f and its child are gone
    assert sorted(m.rid for m in sched.sent) == ["7f", "7f_a1"]
    running = {r.rid: r.to_finish is not None for r in sched.running_batch.reqs}
    assert running == {"7fab": False, "7f_b2": True, "7f": True}
    grammar = {r.rid: r.to_finish is not None for r in sched.grammar_manager.grammar_queue}
    assert grammar == {"7f12": False, "7f_c3": True}
    # abort_all still reaches everyone; an empty rid (a prefix of every rid) reaches no one.
    Scheduler.abort_request(sched, AbortReq(rid=""))
    assert [r.rid for r in sched.waiting_queue] == [VICTIM]
    Scheduler.abort_request(sched, AbortReq(abort_all=True))
    assert sched.waiting_queue == [] and all(r.to_finish is not None for r in sched.running_batch.reqs)


def _tokenized(rid: str, ipc: str | None = None):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    return TokenizedGenerateReqInput(
        rid=rid,
        http_worker_ipc=ipc,
        input_text=TEXT,
        input_ids=array("q", [5, 6, 7]),
        input_embeds=None,
        mm_inputs=None,
        token_type_ids=None,
        sampling_params=SamplingParams(max_new_tokens=8),
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=False,
    )


def _accepted_by_sglang(sched, recv):
    """What SGLang's handle_generate_request leaves for a plain request: a Req in the waiting queue."""
    sched.waiting_queue.append(_req(recv.rid))


def test_a_rid_live_at_the_scheduler_is_refused_until_its_request_ends():
    """Two tokenizer workers each accepted rid 'dup' (each checks only its own requests): the scheduler
    answers the second with a 400 through the second's worker and never makes a second Req."""
    from sglang.srt.managers.scheduler import Scheduler

    sched = _sched()
    live_rids.refuse_live_duplicate(_accepted_by_sglang, sched, _tokenized("dup", "ipc-worker-1"))
    assert [r.rid for r in sched.waiting_queue] == ["dup"]
    Scheduler.handle_generate_request(sched, _tokenized("dup", "ipc-worker-2"))  # SGLang's, hooked
    (refusal,) = sched.sent
    assert refusal.rid == "dup" and refusal.http_worker_ipc == "ipc-worker-2"
    assert refusal.finished_reason["status_code"] == 400 and "still running" in refusal.finished_reason["message"]
    assert len(sched.waiting_queue) == 1
    # Running: still refused. Finished (its output sent): the rid is free again.
    sched.running_batch.reqs, sched.waiting_queue = sched.waiting_queue, []
    Scheduler.handle_generate_request(sched, _tokenized("dup"))
    assert len(sched.sent) == 2
    sched.running_batch.reqs[0].finished_reason = SimpleNamespace()
    live_rids.refuse_live_duplicate(_accepted_by_sglang, sched, _tokenized("dup"))
    assert len(sched.sent) == 2 and [r.rid for r in sched.waiting_queue] == ["dup"]


def test_the_rid_book_needs_the_live_list_only_for_a_rid_seen_before_and_stays_small():
    book, scans = RidBook(), []

    def live():
        scans.append(1)
        return {"a", "b"}

    for i in range(RidBook.MIN_PRUNE):
        assert not book.maybe_live(f"r{i}")
        book.accept(f"r{i}", live)
    assert scans == [] and book.maybe_live("r7")
    book.accept("new", live)  # past MIN_PRUNE ids: only the live ones stay
    assert scans == [1] and book.seen == {"a", "b", "new"} and not book.maybe_live("r7")


def test_the_live_list_is_read_on_a_scheduler_outside_pd_disaggregation():
    """Past RidBook.MIN_PRUNE accepted rids the hook prunes its book to the scheduler's live requests: with
    SGLang's disaggregation queues left None, that read (and every abort's) goes through to the next request."""
    sched = _sched(waiting=["q0"], running=["r0"])
    for i in range(RidBook.MIN_PRUNE + 1):
        live_rids.refuse_live_duplicate(_accepted_by_sglang, sched, _tokenized(f"rid{i}"))
    book = vars(sched)[live_rids._BOOK]
    assert len(sched.waiting_queue) == RidBook.MIN_PRUNE + 2 and sched.sent == []
    assert len(book.seen) == RidBook.MIN_PRUNE + 3  # pruned to the live ones: every one accepted is still queued
    assert live_rids.live_ids(sched) == book.seen


def test_a_rust_server_scheduler_takes_sglangs_own_path():
    """With SGLang's embedded Rust server nothing reads the tokenizer socket: no refusal is sent there."""
    sched = _sched()
    sched.rust_server = SimpleNamespace()
    for _ in range(2):
        live_rids.refuse_live_duplicate(_accepted_by_sglang, sched, _tokenized("dup"))
    assert sched.sent == [] and [r.rid for r in sched.waiting_queue] == ["dup", "dup"]


def test_the_batches_searched_are_the_ones_sglangs_abort_searches():
    """From 0.5.22 the scheduler lists its in-flight batches itself (with continuous input polling, the result
    queue's too); the live list reads that list."""
    from sglang.srt.managers.scheduler import Scheduler

    sched = _sched(running=["r0"])
    sched.result_queue = [(SimpleNamespace(reqs=[_req("polled")]), None)]
    sched.enable_continuous_input_polling = True
    expected = {"r0", "polled"} if hasattr(Scheduler, "_collect_inflight_batches") else {"r0"}
    assert live_rids.live_ids(sched) == expected


def test_a_scheduler_without_ps_or_its_own_list_reads_the_pipeline_size_from_the_runtime_context(monkeypatch):
    """0.5.21's scheduler has neither Scheduler.ps nor _collect_inflight_batches: its abort reads the runtime
    context's pipeline size, and so does the live list (an AttributeError there would end the scheduler)."""
    from sglang.srt import runtime_context

    sched = _sched(waiting=["q0"], running=["r0"])
    for name in ("ps", "_collect_inflight_batches"):
        vars(sched).pop(name, None)
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(pp_size=1))
    assert live_rids.live_ids(sched) == {"q0", "r0"}


def test_the_refusal_reaches_the_client_as_a_400_through_sglangs_tokenizer_manager(tmp_path):
    """The AbortReq the scheduler sends back is read by SGLang's own TokenizerManager._handle_abort_req:
    the second client gets a 400 naming the rid; the first is untouched."""
    boundary = make_boundary(write_model_dir(tmp_path / "model", SMOLLM2_CONFIG))
    answer = boundary.scheduler._answer

    def to_tokenizer(msg, req):  # arrives later, through the tokenizer manager's receive loop
        asyncio.get_running_loop().call_soon(boundary.manager._handle_abort_req, msg)

    sched = SimpleNamespace(ipc_channels=SimpleNamespace(send_to_tokenizer=SimpleNamespace(send_output=to_tokenizer)))
    boundary.scheduler._answer = lambda req: live_rids._refuse(sched, req) if req.rid == "dup" else answer(req)
    status, message = boundary.post(GENERATE, {"rid": "dup", "text": TEXT, "sampling_params": {"max_new_tokens": 8}})
    assert status == 400 and "rid 'dup' is the id of a request that is still running" in message, message
    assert boundary.post(GENERATE, {"rid": "other", "text": TEXT})[0] == 200
