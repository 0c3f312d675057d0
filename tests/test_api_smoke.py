"""benchmarks.checks.api_smoke against an in-process loopback stand-in of SGLang's HTTP API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.checks.api_smoke import run_checks

ANSWER = "n = 1, 9, 10 and 18, so the sum is 38."


def serve(stream_answer: str, native_answer: str) -> Iterator[str]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def send(self, payload: bytes, ctype: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            chat = self.path == "/v1/chat/completions"
            if self.path == "/generate":
                return self.send(json.dumps({"text": native_answer, "meta_info": {}}).encode(), "application/json")
            if body.get("stream"):
                pieces = [stream_answer[:10], stream_answer[10:]]
                events = [{"choices": [{"delta": {"content": p}} if chat else {"text": p}]} for p in pieces]
                sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                return self.send(sse.encode(), "text/event-stream")
            choice = {"message": {"role": "assistant", "content": ANSWER}} if chat else {"text": ANSWER}
            reply = {"choices": [choice], "usage": {"completion_tokens": 12}}
            self.send(json.dumps(reply).encode(), "application/json")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


@pytest.fixture()
def good_server() -> Iterator[str]:
    yield from serve(ANSWER, ANSWER)


@pytest.fixture()
def bad_server() -> Iterator[str]:
    # Streams a different text and /generate disagrees: both must be caught.
    yield from serve(ANSWER.upper(), "something else")


def test_all_checks_pass_on_consistent_server(good_server: str) -> None:
    checks = run_checks(good_server, "default", "prompt", timeout=10)
    assert [c["name"] for c in checks] == [
        "chat non-stream",
        "chat stream",
        "completions non-stream",
        "completions stream",
        "native /generate agrees",
    ]
    assert all(c["ok"] for c in checks), checks


def test_stream_and_native_mismatches_fail(bad_server: str) -> None:
    checks = {c["name"]: c for c in run_checks(bad_server, "default", "prompt", timeout=10)}
    assert checks["chat non-stream"]["ok"] and checks["completions non-stream"]["ok"]
    assert not checks["chat stream"]["ok"] and not checks["completions stream"]["ok"]
    assert (
        not checks["native /generate agrees"]["ok"] and "something else" in checks["native /generate agrees"]["detail"]
    )


def test_unreachable_server_fails_every_check() -> None:
    checks = run_checks("http://127.0.0.1:9", "default", "prompt", timeout=2)
    assert len(checks) == 5 and not any(c["ok"] for c in checks)
