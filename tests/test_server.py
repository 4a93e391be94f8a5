"""The HTTP server end to end: a real uvicorn server on 127.0.0.1, the official `openai` client and raw httpx.

The server runs tiny saved checkpoints (random Llama target, a perturbed copy as draft,
word-level tokenizer with a chat template). Expected texts come from a separate
reference copy of the target decoding greedily on its own, so every check compares
the server with plain decoding, never with itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import torch
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from tiny_hf import perturbed_copy, save_tiny_checkpoint, save_tiny_eagle_draft, tiny_llama, tiny_tokenizer

from specdecode.cli import main
from specdecode.core.sampling import SamplingParams
from specdecode.models.loading import LoadedModel, load_model
from specdecode.pipeline import DEFAULT_MIN_CONFIDENCE, Pipeline, make_drafter
from specdecode.server import Server, ServerConfig, create_app
from specdecode.server.errors import APIError
from specdecode.server.metrics import Metrics
from specdecode.server.worker import Cancelled, Failed, Job, Worker

MODEL = "tiny-llama"
PROMPT = "the quick red dog runs to the river and sees a bird"
MAX_PROMPT = 32
MESSAGES = [
    {"role": "system", "content": "you are a small dog"},
    {"role": "user", "content": "hello , what do you see ?"},
    {"role": "assistant", "content": "a big tree"},
    {"role": "user", "content": "and the river ?"},
]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    target = tiny_llama(seed=20)
    tokenizer = tiny_tokenizer()
    return {
        "target": save_tiny_checkpoint(root / "target", target, tokenizer),
        "draft": save_tiny_checkpoint(root / "draft", perturbed_copy(target, seed=21, scale=0.05), tokenizer),
        "eagle": save_tiny_eagle_draft(root / "eagle", target, tokenizer),  # q uniform over 40 tokens
    }


@pytest.fixture(scope="module")
def reference(dirs) -> Pipeline:
    """The target alone, on its own copy of the weights: what plain greedy decoding gives."""
    return Pipeline(load_model(str(dirs["target"])), None)


def greedy(reference: Pipeline, prompt_ids: list[int], max_tokens: int) -> str:
    result = reference.generate(torch.tensor(prompt_ids), max_new_tokens=max_tokens, sampling=SamplingParams(0.0))
    assert len(result.token_ids) == max_tokens  # the tiny models never emit EOS
    return reference.text(result.token_ids)


def text_ids(prompt: str = PROMPT) -> list[int]:
    return tiny_tokenizer()(prompt)["input_ids"]


def chat_ids(messages: list[dict]) -> list[int]:
    return tiny_tokenizer().apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]


@dataclass
class Running:
    server: Server
    thread: threading.Thread
    port: int
    app: object

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker(self):
        return self.app.state.worker

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="x", max_retries=0, **{"timeout": 20.0, **kwargs})

    def metrics(self) -> dict:
        return httpx.get(f"{self.url}/metrics.json").json()


@contextlib.contextmanager
def running(pipeline: Pipeline, config: ServerConfig) -> Iterator[Running]:
    """uvicorn on 127.0.0.1 (a port the OS picked) in a background thread; shut down on exit."""
    app = create_app(pipeline, config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield Running(server, thread, port, app)
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive(), "the server did not shut down"


@pytest.fixture(scope="module")
def served(dirs):
    target = load_model(str(dirs["target"]))
    pipeline = Pipeline(target, make_drafter(str(dirs["draft"]), target), gamma=4)
    config = ServerConfig(model_id=MODEL, max_prompt_tokens=MAX_PROMPT, max_queue=2, draft_aliases=(str(dirs["draft"]),))
    with running(pipeline, config) as server:
        yield server


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return served.client()


class SlowModel:
    """The target with a pause in every `extend`: a 400-token generation takes 8 s unless it is cancelled.

    With `fail` set, `extend` raises instead (a generation that breaks half-way).
    """

    def __init__(self, model, delay: float) -> None:
        self._model, self._delay = model, delay
        self.fail = False

    def __getattr__(self, name):
        return getattr(self._model, name)

    def extend(self, token_ids):
        if self.fail:
            raise RuntimeError("boom: the model broke")
        time.sleep(self._delay)
        return self._model.extend(token_ids)


@pytest.fixture(scope="module")
def slow_pipeline(dirs) -> Pipeline:
    loaded = load_model(str(dirs["target"]))
    return Pipeline(LoadedModel(SlowModel(loaded.model, 0.02), loaded.tokenizer, loaded.hf_model, loaded.source), None)


def metric(snapshot: dict, name: str, **labels) -> float:
    """A counter's value (0 if absent) or a histogram's count in a /metrics.json snapshot."""
    for sample in snapshot.get(name, {}).get("samples", []):
        if all(sample["labels"].get(k) == v for k, v in labels.items()):
            return sample.get("value", sample.get("count"))
    return 0.0


# --------------------------------------------------------------------------- basic endpoints


def test_models_and_health(served, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(f"{served.url}/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["model"] == MODEL
    assert health.json()["gamma"] == 4 and health.json()["min_confidence"] == DEFAULT_MIN_CONFIDENCE
    assert health.json()["max_batch"] == 1 and health.json()["pass_seconds"] is None


def test_completion_is_the_greedy_continuation(client, reference, dirs):
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    choice = response.choices[0]
    assert choice.text == greedy(reference, text_ids(), 12)
    assert choice.finish_reason == "length"
    assert response.object == "text_completion" and response.model == MODEL
    usage = response.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (len(text_ids()), 12, len(text_ids()) + 12)
    spec = usage.speculative  # the extension field
    assert spec["draft"] == f"model:{dirs['draft']}" and spec["gamma"] == 4
    assert spec["target_calls"] + spec["accepted_tokens"] == 12  # each target call keeps the accepted drafts + 1
    assert spec["accepted_tokens"] > 0 and spec["target_calls"] < 12  # a near copy of the target drafts well
    assert spec["mean_accepted"] == pytest.approx(12 / spec["target_calls"])
    assert spec["alpha"] == pytest.approx(spec["accepted_tokens"] / spec["draft_tokens"], abs=0.5)


def test_token_id_prompt(client, reference):
    ids = text_ids()
    response = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert response.choices[0].text == greedy(reference, ids, 6)


def test_chat_applies_the_template_to_every_message(client, reference):
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0)
    ids = chat_ids(MESSAGES)
    assert len(ids) > len(chat_ids(MESSAGES[-1:])) + 5  # the whole conversation, not the last message
    message = response.choices[0].message
    assert message.role == "assistant"
    assert message.content == greedy(reference, ids, 10)
    assert response.choices[0].finish_reason == "length"
    assert response.usage.prompt_tokens == len(ids) and response.usage.completion_tokens == 10


def test_chat_max_completion_tokens(client, reference):
    messages = MESSAGES[-1:]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=5, temperature=0)
    assert response.choices[0].message.content == greedy(reference, chat_ids(messages), 5)
    assert response.usage.completion_tokens == 5


# --------------------------------------------------------------------------- streaming


def test_chat_stream_is_incremental_and_equals_the_full_text(client):
    kwargs = dict(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1
    assert "".join(pieces) == full
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_raw_events(served, client):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    full = client.completions.create(**body).choices[0].text
    with httpx.stream("POST", f"{served.url}/v1/completions", json={**body, "stream": True}, timeout=20) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(e["choices"][0]["text"] for e in events) == full
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for e in events if e["choices"][0]["text"]) > 1


# --------------------------------------------------------------------------- sampling options


def test_seed_reproduces_samples_at_temperature_one(client):
    def sample(seed: int | None) -> str:
        return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=1, seed=seed).choices[0].text

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first
    assert sample(None) != sample(None)  # no seed: a fresh random one each time


def test_a_single_stop_string_is_one_stop_not_its_characters(reference):
    """Pipeline.generate(stop="word"), as OpenAI's API allows, stops at the word, as stop=["word"] does."""
    ids, greedy_params = torch.tensor(text_ids()), SamplingParams(0.0)
    full = reference.text(reference.generate(ids, max_new_tokens=24, sampling=greedy_params).token_ids)
    word = full.split()[4]

    def stopped(stop) -> str:
        return reference.text(reference.generate(ids, max_new_tokens=24, sampling=greedy_params, stop=stop).token_ids, stop)

    assert stopped(word) == stopped([word]) == full[: full.find(word)] != ""


def test_pipeline_without_a_seed_draws_fresh_samples(reference):
    def sample(seed: int | None) -> list[int]:
        ids = torch.tensor(text_ids())
        return reference.generate(ids, max_new_tokens=24, sampling=SamplingParams(1.0), seed=seed).token_ids

    assert sample(5) == sample(5)
    assert sample(None) != sample(None)


def test_stop_strings(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    words = full.split()
    stop = " ".join(words[5:7])
    expected = full[: full.find(stop)]
    assert 0 < len(expected) < len(full) - len(stop)
    for stops in (stop, [stop, "never seen"]):
        response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=stops)
        assert response.choices[0].text == expected
        assert response.choices[0].finish_reason == "stop"
        assert response.usage.completion_tokens < 24
        streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=stops, stream=True)
        assert "".join(c.choices[0].text for c in streamed) == expected


@pytest.mark.parametrize(
    ("extra", "draft", "gamma"),
    [({"draft": "none"}, "none", 0), ({"draft": "ngram", "gamma": 2}, "ngram:1-3", 2), ({"draft": "default", "gamma": 3}, "model", 3)],
)
def test_per_request_draft_and_gamma(client, reference, dirs, extra, draft, gamma):
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, extra_body=extra)
    assert response.choices[0].text == greedy(reference, text_ids(), 10)  # exact whatever the draft
    spec = response.usage.speculative
    assert spec["draft"] == (f"model:{dirs['draft']}" if draft == "model" else draft)
    assert spec["gamma"] == gamma
    if draft == "none":
        assert spec["target_calls"] == 10 and spec["draft_tokens"] == 0 and spec["alpha"] is None


def test_per_request_min_confidence_of_an_eagle_draft_and_the_servers_after_it(dirs, reference):
    from specdecode.native import load_native

    target = load_native(str(dirs["target"]))
    pipeline = Pipeline(target, make_drafter(str(dirs["eagle"]), target, min_confidence=0.5), gamma=4)
    with running(pipeline, ServerConfig(model_id=MODEL, max_prompt_tokens=MAX_PROMPT)) as server:
        client = server.client()

        def speculative(**extra) -> dict:
            response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, extra_body=extra)
            assert response.choices[0].text == greedy(reference, text_ids(), 10)  # exact whatever the threshold
            return response.usage.speculative

        # q is 1/40 for every draft token: below 0.5 the draft ends after its first token, with 0 it never ends early
        for extra, threshold in [({}, 0.5), ({"min_confidence": 0}, 0.0), ({}, 0.5), ({"min_confidence": 0.03}, 0.03)]:
            spec = speculative(**extra)
            assert spec["min_confidence"] == threshold
            at_most_one_each = spec["draft_tokens"] <= spec["target_calls"]
            assert at_most_one_each == (threshold > 1 / 40), (extra, spec)
        assert speculative(draft="ngram")["min_confidence"] is None


def test_per_request_min_confidence_of_a_model_draft(served, client, reference):
    """A draft model's early end per request: 1 ends every draft after its first token (no q reaches 1), 0 drafts
    gamma tokens every call; the text is the greedy one either way."""
    def speculative(threshold: float) -> dict:
        response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0,
                                             extra_body={"min_confidence": threshold})
        assert response.choices[0].text == greedy(reference, text_ids(), 10)
        return response.usage.speculative

    one_each, full = speculative(1.0), speculative(0.0)
    assert one_each["min_confidence"] == 1.0 and one_each["draft_tokens"] == one_each["target_calls"] - 1
    assert full["min_confidence"] == 0.0 and full["draft_tokens"] > full["target_calls"]


# --------------------------------------------------------------------------- errors


def test_n_other_than_one_is_rejected(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=2)
    error = caught.value.response.json()["error"]
    assert error["param"] == "n" and "n=1" in error["message"]


def _check_error(response: httpx.Response, status: int, param: str | None, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert error["param"] == param and error["code"] == code
    if param:
        assert param in error["message"]
    return error


BAD_COMPLETIONS = [
    ({"foo": 1}, "foo", "unknown_parameter"),
    ({"temperature": "hot"}, "temperature", "invalid_type"),
    ({"max_tokens": "5"}, "max_tokens", "invalid_type"),
    ({"max_tokens": 5.0}, "max_tokens", "invalid_type"),
    ({"stream": "yes"}, "stream", "invalid_type"),
    ({"seed": "x"}, "seed", "invalid_type"),
    ({"stop": 5}, "stop", "invalid_type"),
    ({"temperature": 2.5}, "temperature", "invalid_value"),
    ({"temperature": -0.1}, "temperature", "invalid_value"),
    ({"top_p": 0}, "top_p", "invalid_value"),
    ({"top_p": 1.5}, "top_p", "invalid_value"),
    ({"max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"max_tokens": 401}, "max_tokens", "invalid_value"),  # the server's limit is 400
    ({"stop": [""]}, "stop", "invalid_value"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"gamma": 0}, "gamma", "invalid_value"),
    ({"draft": "bigram"}, "draft", "invalid_value"),
    ({"min_confidence": 1.5}, "min_confidence", "invalid_value"),
    ({"draft": "ngram", "min_confidence": 0.5}, "min_confidence", "unsupported_value"),  # prompt lookup has no q
    ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage", "invalid_type"),
    ({"prompt": []}, "prompt", "invalid_value"),
]


@pytest.mark.parametrize(("extra", "param", "code"), BAD_COMPLETIONS)
def test_invalid_completion_requests(served, extra, param, code):
    response = httpx.post(f"{served.url}/v1/completions", json={"model": MODEL, "prompt": PROMPT, **extra})
    error = _check_error(response, 400, param, code)
    assert error["type"] == "invalid_request_error"


BAD_CHATS = [
    ({"messages": []}, "messages", "invalid_value"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": "user", "content": "hi", "mood": "x"}]}, "messages[0].mood", "unknown_parameter"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
    ({"messages": MESSAGES, "max_tokens": 4, "max_completion_tokens": 4}, "max_completion_tokens", "invalid_value"),
    ({"messages": MESSAGES, "max_completion_tokens": 500}, "max_completion_tokens", "invalid_value"),
    ({}, "messages", "missing_required_parameter"),
]


@pytest.mark.parametrize(("body", "param", "code"), BAD_CHATS)
def test_invalid_chat_requests(served, body, param, code):
    _check_error(httpx.post(f"{served.url}/v1/chat/completions", json={"model": MODEL, **body}), 400, param, code)


def test_a_tiny_temperature_samples_the_argmax(client, reference):
    """1e-40 overflows logits / temperature unless the logits are shifted first: the sample is the greedy one."""
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1e-40, seed=3)
    assert response.choices[0].text == greedy(reference, text_ids(), 6)


def test_default_max_tokens_stays_within_a_lower_limit(reference):
    """`serve --max-tokens 8`: a completion without max_tokens gets 8 tokens, not a 400 for the default 16."""
    with running(reference, ServerConfig(model_id=MODEL, max_tokens=8)) as server:
        response = server.client().completions.create(model=MODEL, prompt=PROMPT, temperature=0)
    assert response.usage.completion_tokens == 8
    assert response.choices[0].text == greedy(reference, text_ids(), 8)


def test_server_config_refuses_a_nan_grace_period():
    with pytest.raises(ValueError, match="shutdown_grace"):
        ServerConfig(shutdown_grace=float("nan"))


def test_malformed_json_and_non_object_bodies(served):
    headers = {"content-type": "application/json"}
    for path in ("/v1/completions", "/v1/chat/completions"):
        _check_error(httpx.post(served.url + path, content=b'{"prompt": "the', headers=headers), 400, None, "invalid_json")
        _check_error(httpx.post(served.url + path, content=b"[1, 2]", headers=headers), 400, None, "invalid_type")


def test_unknown_model_and_route(served, client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=4)
    assert caught.value.response.json()["error"]["code"] == "model_not_found"
    _check_error(httpx.get(f"{served.url}/v1/nothing"), 404, None, "not_found")


def test_prompt_length_limit(served, client, reference):
    words = ("the cat sees a dog " * 20).split()
    fits = " ".join(words[:MAX_PROMPT])
    assert len(text_ids(fits)) == MAX_PROMPT
    response = client.completions.create(model=MODEL, prompt=fits, max_tokens=2, temperature=0)
    assert response.usage.prompt_tokens == MAX_PROMPT
    too_long = " ".join(words[: MAX_PROMPT + 1])
    _check_error(httpx.post(f"{served.url}/v1/completions", json={"prompt": too_long}), 400, "prompt", "context_length_exceeded")
    chat = {"messages": [{"role": "user", "content": too_long}]}
    _check_error(httpx.post(f"{served.url}/v1/chat/completions", json=chat), 400, "messages", "context_length_exceeded")


def test_full_queue_answers_429_and_waiting_requests_complete(served, reference):
    """max_queue=2: with the worker paused, one request holds the model thread and two wait; a fourth is refused."""
    results: dict[int, str] = {}

    def stream(i: int) -> None:
        chunks = served.client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4 + i, temperature=0, stream=True
        )
        results[i] = "".join(c.choices[0].text for c in chunks)

    served.worker.pause()
    try:
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while served.worker.waiting + served.worker.running < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as caught:
            served.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
        assert caught.value.response.status_code == 429
        assert caught.value.response.json()["error"]["code"] == "queue_full"
        health = httpx.get(f"{served.url}/health").json()
        assert health["waiting"] + health["running"] == 3
    finally:
        served.worker.resume()
    for thread in threads:
        thread.join(20)
    assert results == {i: greedy(reference, text_ids(), 4 + i) for i in range(3)}


# --------------------------------------------------------------------------- metrics


def test_metrics_count_requests_tokens_and_acceptance(served, client):
    before = served.metrics()
    response = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=7, temperature=0)
    after = served.metrics()
    spec = response.usage.speculative
    draft = spec["draft"]

    def grew(name: str, **labels) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert grew("specdecode_requests", endpoint="/v1/completions", status="200") == 1
    assert grew("specdecode_prompt_tokens") == len(text_ids())
    assert grew("specdecode_completion_tokens") == 7
    assert grew("specdecode_target_calls") == spec["target_calls"]
    assert grew("specdecode_generations", draft=draft, finish_reason="length") == 1
    assert grew("specdecode_time_to_first_token_seconds") == 1
    assert grew("specdecode_generation_tokens_per_second") == 1
    accepted = sum(grew("specdecode_draft_tokens_accepted", draft=draft, position=str(i)) for i in range(1, 5))
    assert accepted == spec["accepted_tokens"]
    assert after["acceptance_by_position"][draft][0] is not None

    text = httpx.get(f"{served.url}/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(text.text)}
    for name in ("specdecode_requests", "specdecode_completion_tokens", "specdecode_target_calls",
                 "specdecode_draft_tokens_accepted", "specdecode_time_to_first_token_seconds",
                 "specdecode_generation_tokens_per_second", "specdecode_requests_waiting"):
        assert name in families
    (completion_tokens,) = [s.value for s in families["specdecode_completion_tokens"].samples if s.name.endswith("_total")]
    assert completion_tokens == metric(after, "specdecode_completion_tokens")
    assert httpx.get(f"{served.url}/v1/metrics").json()["specdecode_completion_tokens"] == after["specdecode_completion_tokens"]


# --------------------------------------------------------------------------- disconnects and shutdown


def test_client_disconnect_cancels_generation(slow_pipeline, reference):
    with running(slow_pipeline, ServerConfig(model_id=MODEL)) as server:
        body = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=20) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                    break  # one piece of text, then hang up
        # a non-streamed request whose client gives up
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False}, timeout=0.5)

        deadline = time.monotonic() + 5
        while metric(server.metrics(), "specdecode_generations", finish_reason="cancelled") < 2:
            assert time.monotonic() < deadline, "the abandoned generations were not cancelled"
            time.sleep(0.05)
        assert metric(server.metrics(), "specdecode_completion_tokens") < 200  # far from 2 x 400

        start = time.monotonic()
        later = server.client(timeout=5.0).completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
        assert later.choices[0].text == greedy(reference, text_ids(), 3)
        assert time.monotonic() - start < 2  # the model thread was free


@pytest.mark.parametrize("route, body", [
    ("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": MESSAGES}),
])
def test_a_stream_whose_client_leaves_before_its_first_chunk_cancels_its_generation(slow_pipeline, route, body):
    """ASGI level: the client is gone while the response starts, so the event stream never begins; the job must
    still be cancelled (else the model thread generates 400 tokens for no one)."""
    request = json.dumps({"model": MODEL, **body, "max_tokens": 400, "temperature": 0, "stream": True}).encode()

    async def scenario() -> float:
        app = create_app(slow_pipeline, ServerConfig(model_id=MODEL))
        async with app.router.lifespan_context(app):
            messages = [{"type": "http.request", "body": request, "more_body": False}]

            async def receive() -> dict:
                return messages.pop(0) if messages else {"type": "http.disconnect"}

            async def send(message: dict) -> None:
                if message["type"] == "http.response.start":
                    await asyncio.sleep(0.5)  # the disconnect arrives first

            scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                     "method": "POST", "path": route, "raw_path": route.encode(), "query_string": b"", "root_path": "",
                     "headers": [(b"content-type", b"application/json")], "scheme": "http",
                     "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}
            await app(scope, receive, send)
            start = time.monotonic()
            while app.state.worker.running or app.state.worker.waiting:
                await asyncio.sleep(0.01)
                if time.monotonic() - start > 5:
                    break
            return time.monotonic() - start

    assert asyncio.run(scenario()) < 2  # 400 tokens at 0.02 s a step would take 8 s


def test_shutdown_refuses_new_and_waiting_requests_and_finishes_the_running_one(slow_pipeline, reference):
    with running(slow_pipeline, ServerConfig(model_id=MODEL)) as server:
        outcomes: dict[str, object] = {}

        def call(name: str, **kwargs) -> None:
            try:
                outcomes[name] = server.client().completions.create(model=MODEL, prompt=PROMPT, temperature=0, **kwargs)
            except openai.APIStatusError as error:
                outcomes[name] = error

        server.worker.pause()
        running_one = threading.Thread(target=call, args=("running",), kwargs={"max_tokens": 3})
        running_one.start()
        while server.worker.running < 1:
            time.sleep(0.01)
        waiting = threading.Thread(target=call, args=("waiting",), kwargs={"max_tokens": 3})
        waiting.start()
        while server.worker.waiting < 1:
            time.sleep(0.01)

        server.worker.loop.call_soon_threadsafe(server.worker.begin_shutdown)
        waiting.join(10)
        assert isinstance(outcomes["waiting"], openai.InternalServerError)
        assert outcomes["waiting"].response.status_code == 503
        assert outcomes["waiting"].response.json()["error"]["code"] == "shutting_down"
        with pytest.raises(openai.InternalServerError) as caught:
            server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        assert caught.value.response.status_code == 503
        assert httpx.get(f"{server.url}/health").status_code == 503

        server.worker.resume()
        running_one.join(10)
        assert outcomes["running"].choices[0].text == greedy(reference, text_ids(), 3)


def test_a_request_cancelled_while_waiting_frees_its_queue_slot():
    """max_queue=1: A runs, B waits and its client leaves; C is queued, not refused, and B never runs."""
    release, ran = threading.Event(), []

    def run(job: Job) -> None:
        ran.append(job.request)
        release.wait(5)
        job.emit(Cancelled())

    async def scenario() -> None:
        worker = Worker(run, max_queue=1)
        await worker.start()
        worker.submit("A")
        await asyncio.sleep(0.05)
        b = worker.submit("B")
        with pytest.raises(APIError):  # the queue is full while B waits
            worker.submit("X")
        b.cancel()
        assert (worker.waiting, worker.running) == (0, 1)
        c = worker.submit("C")
        release.set()
        await c.wait()
        await worker.close()

    asyncio.run(scenario())
    assert ran == ["A", "C"]


def test_requests_refused_at_shutdown_count_as_cancelled_not_as_errors():
    release = threading.Event()
    metrics = Metrics()
    request = type("Request", (), {"draft": "none"})

    async def scenario() -> None:
        worker = Worker(lambda job: release.wait(5), max_queue=4, on_done=metrics.observe_job)
        await worker.start()
        worker.submit(request())
        await asyncio.sleep(0.05)
        waiting = worker.submit(request())
        worker.begin_shutdown()
        assert isinstance(waiting.outcome, Failed) and waiting.outcome.error.status == 503
        release.set()
        await worker.close(grace=5)

    asyncio.run(scenario())
    counts = {s["labels"]["finish_reason"]: s["value"] for s in metrics.snapshot()["specdecode_generations"]["samples"]}
    assert counts == {"cancelled": 2.0}  # the waiting job refused, the running one ended without an outcome


def test_shutdown_cancels_a_long_generation_after_the_grace_period(slow_pipeline):
    with running(slow_pipeline, ServerConfig(model_id=MODEL, shutdown_grace=0.2)) as server:
        stream = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=400, temperature=0, stream=True)
        pieces = iter(stream)
        assert next(pieces).choices[0].text
        start = time.monotonic()
        server.server.should_exit = True
        with pytest.raises(openai.APIError, match="shut down"):
            for _ in pieces:
                pass
        server.thread.join(5)
        assert not server.thread.is_alive()
        assert time.monotonic() - start < 3  # not the 8 s the whole generation would take


def test_a_failing_generation_does_not_take_the_server_down(slow_pipeline, reference):
    with running(slow_pipeline, ServerConfig(model_id=MODEL)) as server:
        client = server.client()
        slow_pipeline.target.model.fail = True
        try:
            with pytest.raises(openai.InternalServerError) as caught:
                client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0)
            error = caught.value.response.json()["error"]
            assert caught.value.response.status_code == 500
            assert error["type"] == "server_error" and "boom" in error["message"]
            stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, stream=True)
            with pytest.raises(openai.APIError, match="boom"):
                list(stream)
        finally:
            slow_pipeline.target.model.fail = False
        later = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
        assert later.choices[0].text == greedy(reference, text_ids(), 3)
        assert metric(server.metrics(), "specdecode_generations", finish_reason="error") == 2


# --------------------------------------------------------------------------- command line


def test_cli_serve_builds_the_pipeline_and_limits(monkeypatch, dirs):
    captured = {}

    def fake_serve(pipeline, config, *, host, port, log_level):
        captured.update(pipeline=pipeline, config=config, host=host, port=port)

    monkeypatch.setattr("specdecode.server.serve", fake_serve)
    argv = ["serve", "--target", str(dirs["target"]), "--draft", "ngram", "--gamma", "3", "--port", "8123",
            "--max-queue", "5", "--max-tokens", "50", "--model-name", "m"]
    assert main(argv) == 0
    assert captured["port"] == 8123 and captured["host"] == "127.0.0.1"
    assert captured["pipeline"].gamma == 3 and captured["pipeline"].drafter.name == "ngram:1-3"
    config = captured["config"]
    assert (config.max_queue, config.max_tokens, config.model_id) == (5, 50, "m")


def test_cli_serve_rejects_bad_options(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["serve", "--gamma", "0"])
    assert caught.value.code == 2
    assert "gamma" in capsys.readouterr().err


# --------------------------------------------------------------------------- continuous batching


@pytest.fixture(scope="module")
def batched(dirs):
    """The target on the native engine, decoding up to 4 requests together (prompt lookup, cost-aware lengths)."""
    from specdecode import backends
    from specdecode.core.draft_length import CostProfile
    from specdecode.drafters import PromptLookupDrafter

    loaded = backends.load(str(dirs["target"]), "native", packing="none")
    costs = CostProfile({1: 1e-3, 2: 1.05e-3, 3: 1.1e-3, 4: 1.15e-3})
    pipeline = Pipeline(loaded, PromptLookupDrafter(), gamma=3, costs=costs)
    config = ServerConfig(model_id=MODEL, max_prompt_tokens=MAX_PROMPT, max_queue=8, max_batch=4)
    with running(pipeline, config) as server:
        yield server


PROMPTS = [PROMPT, "a bird sees the river", "the dog runs and runs and runs", "hello , what do you see ?",
           "the red tree and the big river", "a small dog"]


def test_batched_server_streams_concurrent_requests_each_as_decoded_alone(batched, reference):
    """Six streaming clients at once (four decode together, two wait for a slot) and one bad request among them:
    every text is the greedy continuation of its prompt decoded alone, and the bad one alone gets its 400."""
    texts: dict[int, str] = {}
    errors: list = []

    def stream(i: int) -> None:
        try:
            chunks = batched.client().completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=24,
                                                         temperature=0, stream=True)
            texts[i] = "".join(chunk.choices[0].text for chunk in chunks)
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    bad = httpx.post(f"{batched.url}/v1/completions", json={"model": MODEL, "prompt": "dog " * 40, "max_tokens": 4})
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    assert texts == {i: greedy(reference, text_ids(p), 24) for i, p in enumerate(PROMPTS)}
    snapshot = batched.metrics()
    sequences = snapshot["specdecode_batch_sequences"]["samples"][0]
    assert sequences["count"] > 0 and sequences["sum"] / sequences["count"] > 1.5  # passes did batch requests
    assert snapshot["specdecode_queue_length"]["samples"][0]["count"] >= len(PROMPTS)
    assert batched.app.state.engine.pass_costs is not None
    health = httpx.get(f"{batched.url}/health").json()
    assert health["max_batch"] == 4 and health["pass_seconds"]["1"] > 0  # what the load test records


def test_batched_server_usage_and_a_seeded_sample_alone_or_beside_others(batched):
    """usage.speculative per request; a seeded sample at T=1 is the same alone and while others decode beside it."""
    def sample():
        return batched.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=7)

    alone = sample()
    assert alone.usage.speculative["draft"] == "ngram:1-3"
    others = [threading.Thread(target=lambda p=p: batched.client().completions.create(
        model=MODEL, prompt=p, max_tokens=30, temperature=1.0)) for p in PROMPTS[1:4]]
    for thread in others:
        thread.start()
    beside = sample()
    for thread in others:
        thread.join(60)
    assert beside.choices[0].text == alone.choices[0].text


def test_batching_needs_the_native_engine(dirs):
    with pytest.raises(ValueError, match="max_batch: batching needs the target on the native engine"):
        create_app(Pipeline(load_model(str(dirs["target"])), None), ServerConfig(max_batch=2))


def test_cli_serve_batches_on_the_native_engine_unless_the_draft_is_a_model(monkeypatch, dirs):
    from specdecode.native.batching import DEFAULT_MAX_BATCH

    captured = {}
    monkeypatch.setattr("specdecode.server.serve", lambda pipeline, config, **kwargs: captured.update(config=config))
    base = ["serve", "--target", str(dirs["target"]), "--backend", "native", "--packing", "none"]
    assert main(base + ["--draft", "ngram"]) == 0
    assert captured["config"].max_batch == DEFAULT_MAX_BATCH
    assert main(base + ["--draft", str(dirs["draft"]), "--gamma", "2"]) == 0
    assert captured["config"].max_batch == 1  # a separate draft model keeps one cache
    assert main(base + ["--draft", "ngram", "--max-batch", "3"]) == 0
    assert captured["config"].max_batch == 3
