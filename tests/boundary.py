"""SGLang's real HTTP app and TokenizerManager on CPU, with a stand-in scheduler.

Requests go through SGLang 0.5.17's own FastAPI routes (``/generate``, ``/v1/completions``,
``/v1/chat/completions``, Ollama's ``/api/generate`` and ``/api/chat``), request models,
normalisation and tokenizer-manager validation.
Whatever the tokenizer manager dispatches reaches ``FakeScheduler`` instead of ZMQ: it copies
the message as SGLang's default (pickle) IPC does, checks it against SGLang's own message schema
(``schema_errors``) and the fields that the real scheduler puts into GPU tensors
(``gpu_hazards``), then answers every request with one finished token.

The model folder is SmolLM2-135M's config.json plus a small word-level tokenizer with a chat
template: the tokenizer manager needs a tokenizer, not weights.
"""

from __future__ import annotations

import asyncio
import json
import math
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

I32_MAX = 2**31 - 1
WORDS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"] + [f"w{i}" for i in range(200)]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def write_model_dir(d: Path, config: dict[str, Any]) -> Path:
    """config.json plus a word-level tokenizer (ids 0-205; the config's vocabulary is larger)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    special = {"eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "unk_token": "<|endoftext|>"}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192, "chat_template": CHAT_TEMPLATE}
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, **special}))
    return d


def schema_errors(req: Any) -> list[str]:
    """Fields whose type SGLang's own message schema rejects.

    With SGLANG_USE_PICKLE_IPC=0 the scheduler decodes requests with msgspec against this schema
    and dies on a mismatch (request_receiver does not catch it); with pickle IPC (the default) the
    wrong type travels on and fails wherever the scheduler, detokenizer or grammar backend uses it.
    """
    import msgspec
    from sglang.srt.managers.io_struct import msgpack_decode, msgpack_encode

    from sglang_sparsespec.patches.request_guard import PICKLED_FIELDS

    # The fields SGLang pickles apart, those the installed release has (0.5.23 dropped mm_data_mooncake).
    bare = msgspec.structs.replace(req, **{f: None for f in PICKLED_FIELDS if hasattr(req, f)})
    try:
        msgpack_decode(msgpack_encode(bare))
    except msgspec.ValidationError as e:
        return [f"schema: {e}"]
    return []


def gpu_hazards(req: Any, vocab_size: int) -> list[str]:
    """What in a decoded TokenizedGenerateReqInput would fail in the real scheduler (SGLang 0.5.17).

    Each rule names the scheduler code that puts the field into a tensor:
    embedding lookup (input ids), SamplingBatchInfo.from_schedule_batch (top_k as int32,
    logit_bias as fp32, sampling_seed as int64), get_top_logprobs (topk over the vocabulary),
    penaltylib.min_new_tokens (scatter_add of stop_token_ids into a vocab-sized row).
    """
    sp, out = req.sampling_params, []
    ids = list(req.input_ids) if req.input_ids is not None else None
    if ids is not None and req.mm_inputs is None:
        if not ids:
            out.append("empty prompt")
        elif min(ids) < 0 or max(ids) >= vocab_size:
            out.append("token id outside the vocabulary")
    if sp.top_k > I32_MAX:
        out.append("top_k overflows int32")
    if not 0 <= req.top_logprobs_num <= vocab_size:
        out.append("top_logprobs_num outside [0, vocab]")
    if sp.min_new_tokens > 0 and any(not 0 <= t < vocab_size for t in sp.stop_token_ids or ()):
        out.append("stop_token_ids outside the vocabulary")
    if any(not math.isfinite(v) or abs(v) > 3.4e38 for v in (sp.logit_bias or {}).values()):
        out.append("logit_bias not finite in fp32")
    if sp.sampling_seed is not None and not -(2**63) <= sp.sampling_seed < 2**63:
        out.append("sampling_seed overflows int64")
    return out


@dataclass
class FakeScheduler:
    """Receives what the tokenizer manager dispatches; ``received``/``failures`` per request."""

    manager: Any
    vocab_size: int
    received: list[Any] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # what would have killed the real scheduler

    def __call__(self, obj: Any) -> None:
        from sglang.srt.managers.io_struct import BatchTokenizedGenerateReqInput, TokenizedGenerateReqInput

        # SGLang's default IPC pickles (SGLANG_USE_PICKLE_IPC=1): the scheduler gets these objects as built.
        batch = obj.batch if isinstance(obj, BatchTokenizedGenerateReqInput) else [obj]
        for req in pickle.loads(pickle.dumps(batch)):
            if not isinstance(req, TokenizedGenerateReqInput):
                continue  # AbortReq and friends
            self.received.append(req)
            self.failures += schema_errors(req) or gpu_hazards(req, self.vocab_size)
            self._answer(req)

    def _answer(self, req: Any) -> None:
        state = self.manager.rid_to_state.get(req.rid)
        if state is None:
            return
        meta = {
            "id": req.rid,
            "finish_reason": {"type": "length", "length": 1},
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": 1,
            "cached_tokens": 0,
            "weight_version": "default",
        }
        if req.return_logprob:  # one output token, as the tokenizer manager formats it for the OpenAI layer
            meta["output_token_logprobs"] = [(-0.5, 7, "w1")]
            meta["output_top_logprobs"] = [[(-0.5, 7, "w1")] * req.top_logprobs_num]
        state.out_list.append({"text": "w1", "output_ids": [7], "meta_info": meta})
        state.finished = True
        state.event.set()


@dataclass
class Boundary:
    """One tokenizer manager behind SGLang's app; ``post`` returns (status, parsed body)."""

    manager: Any
    scheduler: FakeScheduler
    app: Any

    def post(self, path: str, body: Any) -> tuple[int, str]:
        """(status, error message or reply text); a streamed error counts with its event's code."""
        return asyncio.run(self._post(path, body))

    async def _post(self, path: str, body: Any) -> tuple[int, str]:
        import httpx

        from benchmarks.checks.bad_inputs import effective_status

        # Unhandled exceptions become the 500 that uvicorn would send.
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://boundary") as client:
            r = await client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
        text = r.text.removeprefix("data:").split("\n\n", 1)[0]
        try:
            reply = json.loads(text)
        except ValueError:
            return effective_status(r.status_code, r.content), text
        error = reply.get("error", reply) if isinstance(reply, dict) else reply
        message = error.get("message", error) if isinstance(error, dict) else error
        return effective_status(r.status_code, r.content), str(message)

    def reset(self) -> None:
        self.scheduler.received.clear()
        self.scheduler.failures.clear()


def make_boundary(model_dir: Path, **server_args: Any) -> Boundary:
    """A real TokenizerManager for ``model_dir`` wired into ``sglang...http_server.app``."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.ollama.serving import OllamaServing
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.server_args import PortArgs, ServerArgs

    from sglang.srt import runtime_context

    from sglang_sparsespec.patches.contacts import resolve

    sa = resolve(ServerArgs(model_path=str(model_dir), attention_backend="triton", device="cpu", **server_args))
    # The HTTP process publishes its ServerArgs before it builds the manager (which 0.5.19 onwards read from
    # the published configuration); the boundary's replace whatever an earlier one published.
    runtime_context.publish(sa, role="tokenizer")
    manager = TokenizerManager(sa, PortArgs.init_new(sa))
    manager.max_req_input_len = manager.context_len - 1
    manager.event_loop = asyncio.new_event_loop()  # marks the output loop as started: the fake answers instead
    scheduler = FakeScheduler(manager, manager.model_config.vocab_size)
    manager._dispatch_to_scheduler = scheduler
    templates = TemplateManager()
    templates.initialize_templates(tokenizer_manager=manager, model_path=str(model_dir))
    http_server.set_global_state(http_server._GlobalState(manager, templates, {}))
    app = http_server.app
    app.state.openai_serving_completion = OpenAIServingCompletion(manager, templates)
    app.state.openai_serving_chat = manager.serving_chat_class(manager, templates)
    app.state.ollama_serving = OllamaServing(manager)
    return Boundary(manager, scheduler, app)
