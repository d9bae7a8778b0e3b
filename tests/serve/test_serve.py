"""`slmlab serve`: the official openai client against a server in a subprocess, every bad input,
API keys, disconnects, and every family through the same app (in-process)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch

from serve_helpers import build_checkpoint, running_server
from slmlab.cli import main
from slmlab.serve.chat import render_chat

KEY = "test-key"
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint("lumen", tmp_path_factory.mktemp("serve") / "tiny-lumen")


@pytest.fixture(scope="module")
def server(checkpoint):
    with running_server(checkpoint, "--api-key", KEY, "--max-batch", "4") as (url, proc):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=60)


def raw(server: str, path: str, body, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server}{path}", content=content, headers=headers, timeout=60)


def streamed_completion(client, **kwargs) -> tuple[str, str, int]:
    text, finish, usage = [], None, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text.append(choice.text)
            finish = choice.finish_reason or finish
    return "".join(text), finish, usage


def _ask_together(http, prompts: list[str], max_tokens: int) -> list[dict]:
    """Greedy completions of ``prompts``, sent at the same moment from one thread each."""
    start = threading.Barrier(len(prompts))

    def ask(p):
        start.wait()
        return http.post("/v1/completions", json={"prompt": p, "max_tokens": max_tokens, "temperature": 0}).json()

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(ask, prompts))


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == ["tiny-lumen"]
    health = httpx.get(f"{server}/health").json()
    assert health["status"] == "ok" and health["mode"] == "batched" and health["max_batch"] == 4


def test_completion_streamed_equals_non_streamed_equals_slmlab_generate(client, checkpoint, capsys):
    full = client.completions.create(model="tiny-lumen", prompt=PROMPT, max_tokens=12, temperature=0, seed=1)
    text = full.choices[0].text
    assert full.object == "text_completion" and full.choices[0].finish_reason == "length"
    assert (full.usage.prompt_tokens, full.usage.completion_tokens, full.usage.total_tokens) == (19, 12, 31)
    assert len(text) == 12  # the test model writes one printable byte per token
    assert streamed_completion(client, model="tiny-lumen", prompt=PROMPT, max_tokens=12, temperature=0, seed=1) == (
        text, "length", 12)
    capsys.readouterr()
    assert main(["generate", str(checkpoint), "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out == PROMPT + text + "\n"


def test_chat_completion_streamed_and_not(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    full = client.chat.completions.create(model="tiny-lumen", messages=messages, max_tokens=10, temperature=0)
    answer = full.choices[0].message
    assert full.object == "chat.completion" and answer.role == "assistant" and len(answer.content) == 10
    assert full.usage.prompt_tokens == len(render_chat(messages).encode())  # one byte per token
    chunks = list(client.chat.completions.create(model="tiny-lumen", messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer.content
    assert chunks[-1].choices[0].finish_reason == "length"
    # the template is a plain prompt: the chat answer is the completion of the rendered conversation
    plain = client.completions.create(model="tiny-lumen", prompt=render_chat(messages), max_tokens=10, temperature=0)
    assert plain.choices[0].text == answer.content


def test_sampling_is_reproducible_by_seed_and_stop_strings_cut_the_text(client):
    kwargs = dict(model="tiny-lumen", prompt=PROMPT, max_tokens=16, temperature=0.9, top_p=0.9, extra_body={"top_k": 20})
    first = client.completions.create(seed=7, **kwargs).choices[0].text
    assert client.completions.create(seed=7, **kwargs).choices[0].text == first
    greedy = client.completions.create(model="tiny-lumen", prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    stop = greedy[6:8]
    cut = greedy[: greedy.index(stop)]
    done = client.completions.create(model="tiny-lumen", prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop, "@@"])
    assert (done.choices[0].text, done.choices[0].finish_reason) == (cut, "stop")
    assert streamed_completion(client, model="tiny-lumen", prompt=PROMPT, max_tokens=16, temperature=0, stop=stop)[:2] == (
        cut, "stop")


LONG = "x" * 2100  # the test model's context is 2048 tokens (one byte per token)
BAD_INPUTS = [
    ("/v1/completions", b'{"prompt": "hi", ', 400, "not valid JSON"),
    ("/v1/completions", b'{"prompt": "\xff\xfe"}', 400, "not valid UTF-8"),
    ("/v1/completions", b"[1, 2]", 400, "must be a JSON object"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "'gpt-4' does not exist"),
    ("/v1/completions", {"prompt": LONG}, 400, "2100 tokens.*context is 2048"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400, "2117 tokens.*context is 2048"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "'max_tokens' must be at least 1"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, 400, "'max_tokens' must be at least 1"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 5000}, 400, "5000, above the model's context of 2048"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2047}, 400, r"context is 2048.*2049 \(2 in the prompt"),
    ("/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400, "'temperature' must be >= 0"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, r"'top_p' must be in \(0, 1\]"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, r"'top_p' must be in \(0, 1\]"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 3}, 400, "'logprobs' is not supported"),
    ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "'n' must be 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400,
     "'tools' is not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, 400,
     "'logprobs' is not supported"),
    ("/v1/completions", {"prompt": "hi", "frobnicate": 1}, 400, "unrecognized request argument 'frobnicate'"),
    ("/v1/completions", {"prompt": ""}, 400, "'prompt' is empty"),
    ("/v1/completions", {"prompt": []}, 400, "'prompt' is empty"),
    ("/v1/chat/completions", {"messages": []}, 400, "'messages' must be a non-empty list"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, "role \"tool\" is not supported"),
    ("/v1/completions", {"prompt": [1, 2, 999]}, 400, "token id 999 .* outside the vocabulary"),
    ("/v1/completions", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "'stop' takes 1 to 4"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "'temperature' must be a number"),
]


@pytest.mark.parametrize("path, body, status, message", BAD_INPUTS, ids=[f"{i}-{b[3][:24]}" for i, b in enumerate(BAD_INPUTS)])
def test_bad_input_is_a_json_error_and_the_server_keeps_answering(server, client, path, body, status, message):
    import re

    response = raw(server, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert re.search(message, error["message"]), error
    assert error["type"] and "Traceback" not in response.text
    again = client.completions.create(model="tiny-lumen", prompt="ok", max_tokens=2, temperature=0)
    assert again.usage.completion_tokens == 2


def test_api_key_is_required_on_v1_routes(server):
    for key in (None, "wrong"):
        response = raw(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1}, key=key)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    denied = httpx.get(f"{server}/v1/models")
    assert denied.status_code == 401
    assert raw(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1}).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server}/v1", api_key="nope", max_retries=0).models.list()


def test_a_client_that_disconnects_mid_stream_frees_its_row(server, client):
    before = httpx.get(f"{server}/health").json()
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": "A long one", "max_tokens": 2000, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{server}/v1/completions", json=body, headers=headers) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # the long request is decoding
        assert all(not line or line.startswith("data: ") for line in got)
        with ThreadPoolExecutor(1) as pool:  # another client streams alongside it
            other = pool.submit(streamed_completion, client, model="tiny-lumen", prompt="short", max_tokens=40,
                                temperature=0)
            time.sleep(0.2)
            r.close()  # the long client goes away mid-stream
            assert other.result(timeout=60) == (other.result()[0], "length", 40)
    deadline = time.monotonic() + 30
    while True:
        health = httpx.get(f"{server}/health").json()
        if health["running"] == 0 and health["cancelled"] > before["cancelled"]:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.1)
    assert health["tokens"] - before["tokens"] < 2000  # the abandoned request stopped early
    assert client.completions.create(model="tiny-lumen", prompt="ok", max_tokens=3, temperature=0).usage.completion_tokens == 3


def test_a_full_queue_answers_503_with_retry_after(checkpoint):
    from fastapi.testclient import TestClient

    from slmlab.serve.server import build_server

    server = build_server(checkpoint, max_batch=2, max_queue=1)
    server.worker.max_queue = 0  # the worker is not started: nothing may wait
    response = TestClient(server.app).post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "server_overloaded"


FAMILIES = ["lumen", "lfm2", "pgsm", "nanohammer", "neollm"]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_answers_completions_batched_as_alone(family, tmp_path):
    """Every family through the same app: four concurrent greedy completions, each equal to the
    family's own generate() on that prompt alone."""
    from fastapi.testclient import TestClient

    from slmlab.generation import generate
    from slmlab.serve.server import build_server
    from slmlab.train.saved import load_for_inference

    ckpt = build_checkpoint(family, tmp_path / family)
    server = build_server(ckpt, max_batch=4)
    assert server.batching_refusal is None, server.batching_refusal
    prompts = ["Hi", "Tell me a story about", "abc", "Once upon a time, far away"]
    loaded = load_for_inference(ckpt, "cpu")
    model, tokenizer = loaded.model, loaded.tokenizer
    expected = []
    for p in prompts:
        ids = torch.tensor([tokenizer(p, add_special_tokens=False)["input_ids"]])
        expected.append(tokenizer.decode(generate(model, ids, 48)[0, ids.shape[1]:]))
    with TestClient(server.app) as http:
        answers = _ask_together(http, prompts, 48)
        assert [a["choices"][0]["text"] for a in answers] == expected
        assert all(a["usage"]["completion_tokens"] == 48 for a in answers)
        assert http.get("/health").json()["peak_running"] >= 2  # the requests did share decoding steps


def test_max_batch_1_serves_one_request_at_a_time(checkpoint):
    from fastapi.testclient import TestClient

    from slmlab.serve.server import build_server

    server = build_server(checkpoint, max_batch=1)
    assert server.batching_refusal == "--max-batch 1" and "one request at a time" in server.describe()[1]
    with TestClient(server.app) as http:
        assert http.get("/health").json()["mode"] == "sequential"
        one = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0}).json()
        chunks = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True})
        events = [line[6:] for line in chunks.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == one["choices"][0]["text"]
    assert len(one["choices"][0]["text"]) == 12


def test_text_stream_holds_back_partial_characters_and_stop_prefixes():
    from slmlab.data.tokenizers import byte_tokenizer
    from slmlab.generation.text import TextStream

    tokenizer = byte_tokenizer()
    stream = TextStream(tokenizer, ["ab"])
    deltas = [stream.push(t) for t in b"xa" + "é".encode() + b"ab"]
    # "a" waits (it may start "ab"), the first byte of "é" waits for the second; "ab" stops the text
    assert deltas == ["x", "", "", "aé", "", ""] and stream.stopped and stream.text == "xaé"
    assert "".join(deltas) + stream.flush() == stream.text
    open_end = TextStream(tokenizer, ["ab"])
    assert [open_end.push(t) for t in b"za"] == ["z", ""] and open_end.flush() == "a"  # the end releases the tail


def test_cli_refuses_a_missing_run_and_a_port_in_use(tmp_path, checkpoint, capsys):
    import socket

    assert main(["serve", str(tmp_path / "nowhere"), "--port", "0"]) == 2
    assert "no run or checkpoint" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", str(checkpoint), "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_a_failing_decoding_step_fails_its_rows_and_the_server_goes_on(checkpoint, monkeypatch):
    from fastapi.testclient import TestClient

    from slmlab.serve.batch import DecodeBatch
    from slmlab.serve.server import build_server

    real_step, calls = DecodeBatch.step, []

    def flaky(self):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected failure")
        return real_step(self)

    server = build_server(checkpoint, max_batch=4)  # its start-up probe runs the real step
    server.worker.alone_first = False  # a lone request takes a row of the batch too
    monkeypatch.setattr(DecodeBatch, "step", flaky)
    with TestClient(server.app) as http:
        failed = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5, "temperature": 0})
        assert failed.status_code == 500 and "injected failure" in failed.json()["error"]["message"]
        ok = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 5
        assert http.get("/health").json()["failed"] == 1


def test_a_lone_request_decodes_alone_and_hands_over_to_the_batch_when_another_arrives(checkpoint, monkeypatch):
    """With one active request the batching server runs the one-at-a-time path (generate and the
    decode plan, no batched step); a second request moves the first into the batch mid-way, and both
    texts equal generate() alone."""
    from fastapi.testclient import TestClient

    from slmlab.generation import generate
    from slmlab.serve.batch import DecodeBatch
    from slmlab.serve.server import build_server
    from slmlab.serve.worker import Worker
    from slmlab.train.saved import load_for_inference

    steps, handed = [], []
    real_step, real_join = DecodeBatch.step, Worker._join_handed_over
    server = build_server(checkpoint, max_batch=4)  # its start-up probe runs the real step
    monkeypatch.setattr(DecodeBatch, "step", lambda self: steps.append(len(self)) or real_step(self))
    monkeypatch.setattr(Worker, "_join_handed_over", lambda self, rows, job: handed.append(job.tokens) or real_join(self, rows, job))
    loaded = load_for_inference(checkpoint, "cpu")

    def alone(prompt: str, n: int) -> str:
        ids = torch.tensor([loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        return loaded.tokenizer.decode(generate(loaded.model, ids, n)[0, ids.shape[1]:])

    def ask(http, prompt: str, n: int) -> dict:
        return http.post("/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0}).json()

    with TestClient(server.app) as http:
        assert ask(http, PROMPT, 24)["choices"][0]["text"] == alone(PROMPT, 24)
        assert steps == [] and handed == []  # one request: no batched step ran
        with ThreadPoolExecutor(2) as pool:
            long = pool.submit(ask, http, PROMPT, 1500)
            while http.get("/health").json()["tokens"] < 24 + 5:  # the long one is decoding alone
                time.sleep(0.01)
            short = ask(http, "Once upon a time", 16)
            long = long.result()
    assert len(handed) == 1 and 5 <= handed[0] < 1500 and max(steps) == 2
    assert short["choices"][0]["text"] == alone("Once upon a time", 16)
    assert long["choices"][0]["text"] == alone(PROMPT, 1500) and long["usage"]["completion_tokens"] == 1500


@pytest.mark.parametrize("family, scheme", [("lumen", "int8"), ("lfm2", "int8"), ("pgsm", "int8"), ("lumen", "int4"),
                                            ("pgsm", "int4")])
def test_quantized_weights_serve_with_continuous_batching(family, scheme, tmp_path):
    """``--quantize int8|int4`` keeps continuous batching (the start-up probe passes: each output row of
    either kernel depends on its own input row only), and batched greedy completions equal the quantized
    model's generate() alone."""
    from fastapi.testclient import TestClient

    from slmlab.generation import generate
    from slmlab.models.quantize import quantize, quantized_modules
    from slmlab.serve.server import build_server
    from slmlab.train.saved import load_for_inference

    ckpt = build_checkpoint(family, tmp_path / family)
    server = build_server(ckpt, max_batch=4, quantize=scheme)
    assert server.batching_refusal is None, server.batching_refusal
    assert quantized_modules(server.served.model)
    loaded = load_for_inference(ckpt, "cpu")
    quantize(loaded.model, scheme)
    prompts = ["Hi", "Tell me a story about", "abc", "Once upon a time, far away"]
    expected = []
    for p in prompts:
        ids = torch.tensor([loaded.tokenizer(p, add_special_tokens=False)["input_ids"]])
        expected.append(loaded.tokenizer.decode(generate(loaded.model, ids, 32)[0, ids.shape[1]:]))
    with TestClient(server.app) as http:
        answers = _ask_together(http, prompts, 32)
        assert [a["choices"][0]["text"] for a in answers] == expected
        assert http.get("/health").json()["peak_running"] >= 2
