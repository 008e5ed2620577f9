"""sim.live.loadgen: prompts of a given length that share no prefix, its config, and its client cap over real HTTP."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from sim.live.loadgen import WORDS, LoadGenConfig, PromptBuilder, load_config, random_words, replay
from tests.support.fixtures_routing import RunningServer
from workloads.traces import Trace


def test_prompts_are_deterministic_and_share_no_prefix():
    a, b = random_words(400, seed=1), random_words(400, seed=2)
    assert a == random_words(400, seed=1)
    assert a.split()[:8] != b.split()[:8]  # an engine's prefix cache (blocks of 16+ tokens) finds nothing
    assert set(a.split()) <= set(WORDS)


@pytest.mark.parametrize("overhead, per_word, tokens, words", [
    (13, 1.0, 1013, 1000),
    (13, 1.25, 1013, 800),
    (13, 1.0, 5, 0),  # shorter than the chat template: the empty prompt
])
def test_prompt_length_follows_the_calibration(overhead, per_word, tokens, words):
    builder = PromptBuilder(overhead, per_word)
    assert builder.words_for(tokens) == words
    assert len(builder.prompt(tokens, seed=0).split()) == words


def test_a_tokenizer_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="calibration: a word costs 0.0 tokens"):
        PromptBuilder(13, 0.0)


def test_independent_tenants_by_default_and_bad_config_in_one_line(tmp_path):
    assert LoadGenConfig(url="http://x", model="m", out_dir="o", trace_path="t").jitter_s == 30.0
    path = tmp_path / "loadgen.yaml"
    path.write_text("url: http://x\nmodel: m\nout_dir: o\ntrace_path: t\nload_multiplier: -1\n")
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: load_multiplier: ") and "\n" not in str(info.value)


def test_a_cross_field_check_is_one_line_without_pydantics_prefix(tmp_path):
    path = tmp_path / "loadgen.yaml"
    path.write_text("url: http://x\nmodel: m\nout_dir: o\ntrace_path: t\nload_multiplier: 2\n"
                    "shape: [{duration_s: 60, load_multiplier: 1}]\n")
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert str(info.value) == (f"{path}: (top level): shape replaces trace_duration_s and load_multiplier: "
                               "set one or the other")


def slow_chat_server(hold_s: float):
    """A chat-completions endpoint over real HTTP that answers each streamed request after hold_s, and counts
    the requests it holds at once (the most is what a client cap must bound)."""
    app = FastAPI()
    app.state.now = app.state.most = app.state.served = 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        words = len(body["messages"][0]["content"].split())
        usage = {"prompt_tokens": 13 + words, "completion_tokens": body["max_tokens"]}
        if not body.get("stream"):
            return {"usage": usage}

        async def events():
            app.state.now += 1
            app.state.most = max(app.state.most, app.state.now)
            try:
                await asyncio.sleep(hold_s)
                yield f"data: {json.dumps({'choices': [{'delta': {'content': 'x'}}]})}\n\n"
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
                app.state.served += 1
            finally:
                app.state.now -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.mark.parametrize("max_in_flight, sent, shed", [(None, 20, 0), (3, 3, 17)])
def test_a_client_cap_sheds_arrivals_beyond_it_and_counts_them(tmp_path, max_in_flight, sent, shed):
    """20 arrivals within 0.2 s at a server holding each 1 s: open loop sends all 20; a cap of 3 sends 3
    (all answered) and counts the other 17 as shed, never sent, so no backlog outlasts the burst."""
    app = slow_chat_server(hold_s=1.0)
    trace = Trace("burst", np.linspace(0.0, 0.2, 20), np.full(20, 50), np.full(20, 4))
    with RunningServer(app) as server:
        cfg = LoadGenConfig(url=server.url, model="m", out_dir=str(tmp_path), trace_path="unused",
                            max_in_flight=max_in_flight)
        summary = asyncio.run(replay(cfg, trace, stop=asyncio.Event()))
    assert (summary["sent"], summary["ok"], summary["shed"], summary["done"]) == (sent, sent, shed, True)
    assert app.state.served == sent and app.state.most == (max_in_flight or 20)
