"""`slmlab serve` against hostile or unlucky input: out-of-range fields, broken Unicode, deep JSON,
huge bodies, failures inside the worker, clients that go away, signals and an empty API key.

Every case is answered (never a hang, never a 500 for a bad request), the other clients are served
meanwhile, and the server stops when told. No assertion here is about time: waits are bounded by a
count of polls, and the timeouts only keep a broken server from hanging the test run."""

from __future__ import annotations

import collections
import json
import re
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serve_helpers import build_checkpoint, running_server, server_log

KEY = "robust-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
TIMEOUT = 60  # seconds a client waits for an answer: only a hung server reaches it
POLLS = 1200  # at most this many /health polls, 0.05 s apart, while waiting for the server to settle


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint("lumen", tmp_path_factory.mktemp("robust") / "tiny-lumen")


@pytest.fixture(scope="module")
def server(checkpoint):
    with running_server(checkpoint, "--api-key", KEY, "--max-batch", "4") as (url, proc):
        yield url


def post(url: str, path: str, body, headers=HEADERS, timeout: float = TIMEOUT) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}{path}", content=content, headers={**headers, "Content-Type": "application/json"},
                      timeout=timeout)


def health(url: str) -> dict:
    return httpx.get(f"{url}/health", timeout=TIMEOUT).json()


def wait_for(url: str, ready) -> dict:
    """Poll /health until ``ready(health)``; fail after :data:`POLLS` polls."""
    for _ in range(POLLS):
        state = health(url)
        if ready(state):
            return state
        time.sleep(0.05)
    raise AssertionError(f"the server never reached the expected state: {state}")


def stream(url: str, body: dict, headers=HEADERS, started: threading.Event | None = None):
    """A streamed completion: ``(text, finish_reason, error events, cut)``; ``cut`` when the connection
    ended without ``data: [DONE]``. ``started`` is set at the first chunk."""
    text, finish, errors, done = [], None, [], False
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, headers=headers,
                          timeout=TIMEOUT) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                event = json.loads(line[6:])
                if started is not None:
                    started.set()
                if "error" in event:
                    errors.append(event["error"])
                    continue
                for choice in event["choices"]:
                    text.append(choice["text"])
                    finish = choice["finish_reason"] or finish
    except httpx.TransportError:
        pass
    return "".join(text), finish, errors, not done


def ok_after(url: str) -> None:
    """A valid request still gets its completion."""
    again = post(url, "/v1/completions", {"prompt": "ok", "max_tokens": 2, "temperature": 0})
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 2, again.text


C, H = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
DEEP = '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"
NESTED_USER = '{"messages": [{"role": "user", "content": "hi"}], "user": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}"
# (path, body: a dict or the raw JSON text, the field the error names, the message)
BAD_FIELDS = [
    (C, {"prompt": "hi", "max_tokens": 5, "seed": 2**70}, "seed", r"'seed' must be an integer from 0 to 18446744073709551615"),
    (C, {"prompt": "hi", "max_tokens": 5, "seed": -1}, "seed", "'seed' must be an integer from 0"),
    (C, {"prompt": "hi", "max_tokens": 5, "seed": 1e30}, "seed", "'seed' must be an integer from 0"),
    (H, {"messages": USER, "max_tokens": 5, "seed": 2**64, "stream": True}, "seed", "'seed' must be an integer from 0"),
    (C, '{"prompt": "hi", "max_tokens": 1' + "0" * 400 + "}", "max_tokens", "'max_tokens' is 1000.*above the model's context"),
    (C, '{"prompt": "hi", "max_tokens": 1' + "0" * 5000 + "}", None, "not valid JSON.*4300 digits"),
    (C, '{"prompt": "hi", "temperature": 1' + "0" * 400 + "}", "temperature", "'temperature' is out of range"),
    (C, {"prompt": "hi", "stop": ["x" * 300]}, "stop", "at most 256 characters"),
    (C, {"prompt": "hi", "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage",
     "must be true or false"),
    (C, '{"prompt": "\\ud800 hi", "max_tokens": 2}', "prompt", "lone UTF-16 surrogate"),
    (C, '{"prompt": "hi \\udfff", "max_tokens": 2, "stream": true}', "prompt", "lone UTF-16 surrogate"),
    (H, '{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}', "messages[0].content",
     "lone UTF-16 surrogate"),
    (H, '{"messages": [{"role": "user", "content": [{"type": "text", "text": "a\\udc00"}]}], "stream": true}',
     "messages[0].content[0].text", "lone UTF-16 surrogate"),
    (C, '{"prompt": "hi", "model": "\\ud800"}', "model", "lone UTF-16 surrogate"),
    (C, '{"prompt": "hi", "\\ud800": 1}', None, "a key of the request body holds a lone UTF-16 surrogate"),
    (C, '{"prompt": "hi", "stop": ["\\ud800"]}', "stop[0]", "lone UTF-16 surrogate"),
    (C, DEEP, None, "nests arrays or objects too deeply"),
    (H, NESTED_USER, re.compile(r"user(\.a)+"), "deeper than 32 levels"),
]


@pytest.mark.parametrize("path, body, param, message", BAD_FIELDS,
                         ids=[f"{i}-{p[2] if isinstance(p[2], str) else 'body'}" for i, p in enumerate(BAD_FIELDS)])
def test_out_of_range_or_malformed_fields_are_400_naming_the_field(server, path, body, param, message):
    response = post(server, path, body.encode() if isinstance(body, str) else body)
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert re.search(message, error["message"]), error
    if isinstance(param, re.Pattern):
        assert param.fullmatch(error["param"]), error
    else:
        assert error["param"] == param, error
    assert error["type"] == "invalid_request_error" and "Traceback" not in response.text
    ok_after(server)


def test_extreme_but_valid_sampling_values_are_served(server):
    """Values at the edges of what is allowed run (no 500): a temperature so small it is greedy, a top_p
    below float32's range, a top_k above the vocabulary, the largest seed, an integral float."""
    greedy = post(server, C, {"prompt": "Edge", "max_tokens": 6, "temperature": 0}).json()["choices"][0]["text"]
    for extra in ({"temperature": 1e-320}, {"temperature": 1e-30}, {"temperature": 0.9, "top_p": 1e-300},
                  {"temperature": 0.9, "top_k": 1}):
        response = post(server, C, {"prompt": "Edge", "max_tokens": 6, "seed": 5, **extra})
        assert response.status_code == 200, (extra, response.text)
        assert response.json()["choices"][0]["text"] == greedy, extra  # each keeps the most likely token only
    sampled = {"prompt": "Edge", "max_tokens": 6, "temperature": 0.9, "top_k": 10**30, "seed": 2**64 - 1}
    first = post(server, C, sampled)
    assert first.status_code == 200, first.text
    assert post(server, C, sampled).json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert post(server, C, {"prompt": "Edge", "max_tokens": 3.0}).json()["usage"]["completion_tokens"] == 3


# A fault the validation cannot see: preparing the request with seed 666 fails inside the worker.
INJECT_PREPARE_FAILURE = """
from slmlab.serve.worker import Worker
_prepare = Worker._prepare
def _failing_prepare(self, job):
    if job.seed == 666:
        raise RuntimeError("injected failure while preparing a request")
    return _prepare(self, job)
Worker._prepare = _failing_prepare
"""
LONG = {"prompt": "A long one", "max_tokens": 1500, "temperature": 0}


@pytest.mark.parametrize("mode", ["4", "1"], ids=["batched", "one-at-a-time"])
def test_a_request_that_fails_while_admitted_fails_alone(checkpoint, mode):
    """The request that fails gets a 500; the running request, the one admitted with it and every
    later one are served."""
    with running_server(checkpoint, "--max-batch", mode, preload=INJECT_PREPARE_FAILURE) as (url, proc), \
            ThreadPoolExecutor(3) as pool:
        before = health(url)
        long = pool.submit(stream, url, LONG, {})
        wait_for(url, lambda h: h["running"] >= 1)
        bad = pool.submit(post, url, C, {"prompt": "hi", "max_tokens": 5, "seed": 666}, {})
        good = pool.submit(post, url, C, {"prompt": "hello", "max_tokens": 5, "seed": 3}, {})
        bad, good = bad.result(), good.result()
        assert bad.status_code == 500 and "injected failure" in bad.json()["error"]["message"], bad.text
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 5, good.text
        text, finish, errors, cut = long.result()
        assert (len(text), finish, errors, cut) == (1500, "length", [], False)
        for _ in range(3):
            assert post(url, C, {"prompt": "later", "max_tokens": 2}, {}).status_code == 200
        after = wait_for(url, lambda h: h["running"] == 0 and h["waiting"] == 0)
        assert after["status"] == "ok" and after["failed"] - before["failed"] == 1
        assert "injected failure" in server_log(proc)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_server_after_a_worker_error_with_requests_in_flight(checkpoint, sig):
    """After a request failed inside the worker, with two rows decoding (one streamed) and one request
    waiting for a row, one SIGINT/SIGTERM stops the server, and every open request is answered (503
    ``server_shutting_down``, as an error event on the stream) or sees its connection close."""
    with running_server(checkpoint, "--max-batch", "2", preload=INJECT_PREPARE_FAILURE) as (url, proc), \
            ThreadPoolExecutor(4) as pool:
        # the client of the failing request waits longer than this test does: a server that never
        # answers it keeps its connection open through the signal
        bad = pool.submit(post, url, C, {"prompt": "hi", "max_tokens": 5, "seed": 666}, {}, 3 * TIMEOUT)
        for _ in range(100):  # give it a moment to be answered (a server that never answers it: see below)
            if bad.done():
                break
            time.sleep(0.05)
        started = threading.Event()
        streamed = pool.submit(stream, url, {**LONG, "max_tokens": 2000}, {}, started)
        assert started.wait(TIMEOUT), server_log(proc)
        plain = pool.submit(post, url, C, {**LONG, "max_tokens": 2000}, {})
        wait_for(url, lambda h: h["running"] == 2)
        queued = pool.submit(post, url, C, {"prompt": "queued", "max_tokens": 5}, {})
        wait_for(url, lambda h: h["waiting"] == 1)
        proc.send_signal(sig)
        try:
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"slmlab serve did not stop on {sig.name}:\n{server_log(proc)[-3000:]}") from None
        assert proc.returncode in (0, 130, 143, -signal.SIGINT, -signal.SIGTERM), proc.returncode
        assert bad.result().status_code == 500
        text, finish, errors, cut = streamed.result()
        assert cut or [e["code"] for e in errors] == ["server_shutting_down"], (finish, errors)
        for request in (plain, queued):
            try:
                response = request.result()
            except httpx.TransportError:
                continue  # the connection closed with the server
            assert response.status_code == 503 and response.json()["error"]["code"] == "server_shutting_down"


def test_a_client_that_disconnects_before_a_non_streamed_answer_frees_its_row(server):
    """With an API key (the middleware sits between the client and the route), a non-streamed
    request whose client goes away is dropped, even while its tokens keep coming."""
    before = health(server)
    body = json.dumps({"prompt": "A long one", "max_tokens": 2000, "temperature": 0}).encode()
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_for(server, lambda h: h["running"] >= 1 and h["tokens"] > before["tokens"] + 20)
    after = wait_for(server, lambda h: h["running"] == 0)
    assert after["cancelled"] > before["cancelled"], after
    assert after["tokens"] - before["tokens"] < 2000, after  # it stopped early
    ok_after(server)


def test_a_5_mb_body_is_413_naming_the_limit(server):
    prompt = "All work and no play makes Jack a dull boy. " * 120_000  # 5.3 MB
    response = post(server, C, {"prompt": prompt, "max_tokens": 2})
    assert response.status_code == 413, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and "limit of 4,194,304 bytes (--max-request-bytes)" in error["message"]
    assert health(server)["status"] == "ok"
    ok_after(server)


def test_max_request_bytes_option_and_a_chunked_body(checkpoint):
    with running_server(checkpoint, "--max-request-bytes", "2000") as (url, proc):
        small = post(url, C, {"prompt": "x" * 1500, "max_tokens": 1}, {})
        assert small.status_code == 200, small.text
        big = post(url, C, {"prompt": "x" * 3000, "max_tokens": 1}, {})
        assert big.status_code == 413 and "limit of 2,000 bytes" in big.json()["error"]["message"]
        payload = json.dumps({"prompt": "y" * 3000, "max_tokens": 1}).encode()
        chunked = httpx.post(f"{url}{C}", content=iter([payload[:1000], payload[1000:2500], payload[2500:]]),
                             timeout=TIMEOUT)  # no Content-Length: the size is counted as it arrives
        assert chunked.status_code == 413 and "limit of 2,000 bytes" in chunked.json()["error"]["message"]
        ok_after(url)


def test_a_prompt_far_beyond_the_context_is_refused_before_it_is_tokenized(checkpoint):
    from fastapi.testclient import TestClient

    from slmlab.serve.server import build_server

    server = build_server(checkpoint, max_batch=2)
    real, seen = server.served.tokenizer, []

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, text, **kwargs):
            seen.append(len(text))
            return real(text, **kwargs)

    server.served.tokenizer = Recording()
    with TestClient(server.app) as http:
        for path, body in ((C, {"prompt": "x" * 50_000}), (H, {"messages": [{"role": "user", "content": "x" * 50_000}]})):
            response = http.post(path, json=body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "context_length_exceeded", error
            assert re.search(r"has 50,0\d\d characters.*context of 2048 tokens.*at most 40,960", error["message"])
        assert seen == []  # neither was tokenized
        response = http.post(C, json={"prompt": "x" * 2100})  # near the context: tokenized, then refused exactly
        assert response.status_code == 400 and "2100 tokens" in response.json()["error"]["message"]
        assert seen == [2100]


def test_health_answers_while_a_long_prompt_is_tokenized(checkpoint):
    """Tokenization runs off the event loop: /health is answered while a prompt is being tokenized
    (here a tokenizer that waits until /health has been answered)."""
    from fastapi.testclient import TestClient

    from slmlab.serve.server import build_server

    server = build_server(checkpoint, max_batch=2)
    real, entered, release, order = server.served.tokenizer, threading.Event(), threading.Event(), []

    class Gated:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, text, **kwargs):
            if text.startswith("GATED"):
                order.append("tokenizing")
                entered.set()
                release.wait(TIMEOUT)  # on the event loop, this would keep /health from being answered
                order.append("tokenized")
            return real(text, **kwargs)

    server.served.tokenizer = Gated()
    with TestClient(server.app) as http, ThreadPoolExecutor(1) as pool:
        big = pool.submit(http.post, C, json={"prompt": "GATED" + "x" * 1800, "max_tokens": 2, "temperature": 0})
        assert entered.wait(TIMEOUT)
        assert http.get("/health").status_code == 200
        order.append("health")
        release.set()
        assert big.result().status_code == 200
    assert order == ["tokenizing", "health", "tokenized"]


def test_a_failing_sample_fails_its_row_alone(checkpoint, monkeypatch):
    """A row whose sampling fails in a decoding step is failed alone; the rows decoding with it go on."""
    from fastapi.testclient import TestClient

    from slmlab.serve import worker as worker_module
    from slmlab.serve.server import build_server

    real, calls = worker_module.sample_next, collections.Counter()

    def flaky(logits, cfg, generator=None):
        if cfg.temperature == 0.75:
            calls["bad"] += 1
            if calls["bad"] == 3:  # a decoding step, not the prefill
                raise RuntimeError("injected sampling failure")
        return real(logits, cfg, generator)

    monkeypatch.setattr(worker_module, "sample_next", flaky)
    server = build_server(checkpoint, max_batch=4)
    with TestClient(server.app) as http, ThreadPoolExecutor(1) as pool:
        other = pool.submit(http.post, C, json={"prompt": "Other", "max_tokens": 1500, "temperature": 0})
        for _ in range(POLLS):
            if http.get("/health").json()["running"] >= 1:
                break
            time.sleep(0.05)
        bad = http.post(C, json={"prompt": "Bad", "max_tokens": 20, "temperature": 0.75, "seed": 1})
        assert bad.status_code == 500 and "injected sampling failure" in bad.json()["error"]["message"]
        other = other.result()
        assert other.status_code == 200 and other.json()["usage"]["completion_tokens"] == 1500, other.text
        assert http.get("/health").json()["failed"] == 1


def test_a_broken_worker_shows_on_health_and_answers_503(checkpoint, monkeypatch):
    from fastapi.testclient import TestClient

    from slmlab.serve.server import build_server
    from slmlab.serve.worker import Worker

    def broken(self):
        raise RuntimeError("injected worker bug")

    monkeypatch.setattr(Worker, "_run_batched", broken)
    server = build_server(checkpoint, max_batch=2)
    with TestClient(server.app) as http:
        for _ in range(POLLS):
            state = http.get("/health")
            if state.status_code != 200:
                break
            time.sleep(0.05)
        assert state.status_code == 503 and state.json()["status"] == "error", state.text
        assert "injected worker bug" in state.json()["error"]
        response = http.post(C, json={"prompt": "hi", "max_tokens": 2})
        assert response.status_code == 503 and response.json()["error"]["code"] == "worker_stopped"


@pytest.mark.parametrize("key, message", [("", "--api-key is empty; "), ("   ", "--api-key is empty; "),
                                          ("my key", "--api-key holds a space")])
def test_an_empty_or_unusable_api_key_is_refused_at_start_up(checkpoint, monkeypatch, capsys, key, message):
    import uvicorn

    from slmlab.cli import main
    from slmlab.serve.server import build_server

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: served.append(a))  # were it to serve, it returns at once
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: served.append(self))
    assert main(["serve", str(checkpoint), "--port", "0", "--api-key", key]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"slmlab serve: error: {message}") and served == [], err
    with pytest.raises(ValueError, match=re.escape(message.strip())):
        build_server(checkpoint, api_key=key)
