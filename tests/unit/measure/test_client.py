"""Protocol tests of the streaming client: SSE parsing, timing and error recording.

The server here is a small aiohttp app that speaks the OpenAI streaming wire format. It is not a stand-in for
vLLM (engine tests use the real one); it lets each protocol case (split chunks, HTTP errors, truncated streams,
timeouts) be produced on purpose.
"""

from __future__ import annotations

import asyncio
import json
import socket

import numpy as np
import pytest
from aiohttp import web

from autotune.measure.client import (
    LevelRun,
    LoadLevel,
    arrival_times,
    measure_level,
    run_level,
)
from autotune.measure.stats import offered_rate
from autotune.measure.workload import RequestSpec


def chunk(text: str | None = "x", usage: dict | None = None, compact: bool = False) -> bytes:
    """An SSE event; `compact` is how vLLM serialises (no spaces, no "usage" key on token chunks)."""
    choices = [] if text is None else [{"index": 0, "text": text, "finish_reason": None}]
    obj = {"id": "cmpl-1", "choices": choices} | ({"usage": usage} if usage or not compact else {})
    sep = (",", ":") if compact else (", ", ": ")
    return b"data: " + json.dumps(obj, separators=sep).encode() + b"\n\n"


class Server:
    """Streams `max_tokens` token chunks `gap` seconds apart; `mode` selects a misbehaviour."""

    def __init__(self, mode: str = "ok", gap: float = 0.0, compact: bool = False, stuck_s: float = 2.0):
        self.mode, self.gap, self.compact, self.stuck_s = mode, gap, compact, stuck_s
        self.bodies: list[dict] = []
        self.in_flight = self.max_in_flight = 0

    def hangs(self) -> bool:
        """Whether the request just received gets nothing for `stuck_s`: every one, after the third, or the second."""
        n = len(self.bodies)
        return {"hang": True, "hang_later": n > 3, "one_stuck": n == 2}.get(self.mode, False)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.mode == "http400":
            return web.json_response({"error": {"message": "max_tokens is too large"}}, status=400)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if self.hangs():
                await asyncio.sleep(self.stuck_s)
            n = body["max_tokens"] - (1 if self.mode == "short" else 0)
            await resp.write(b": ping\n\n")
            for i in range(n):
                if self.gap:
                    await asyncio.sleep(self.gap)
                # continuous usage: a token chunk that also reports usage so far
                usage = {"prompt_tokens": 4, "completion_tokens": i + 1} if self.mode == "continuous" else None
                data = chunk(f'"usage":{{ {i}', usage, self.compact)  # text that looks like a key, escaped
                if self.mode == "split":  # one event across two writes, then two events in one write
                    await resp.write(data[:17])
                    await asyncio.sleep(0.002)
                    await resp.write(data[17:] + (chunk("") if i == 0 else b""))
                else:
                    await resp.write(data)
                if self.mode == "stream_error" and i == 1:
                    await resp.write(b'data: {"error": {"message": "engine died", "code": 500}}\n\n')
            if self.mode == "split":
                n += 1
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": 0}
            await resp.write(chunk(None, usage, self.compact))
            if self.mode != "no_done":
                await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.in_flight -= 1


async def serve(server: Server) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/completions", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def drive(server: Server, specs, level=LoadLevel("concurrency", 1), **kw) -> LevelRun:  # noqa: B008 (frozen)
    async def main():
        runner, url = await serve(server)
        try:
            return await run_level(url, "tiny", specs, level, **kw)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


SPEC = RequestSpec((11, 12, 13, 14), 5)


@pytest.mark.parametrize("mode, compact", [("ok", False), ("ok", True), ("continuous", True)])
def test_stream_is_timed_and_counted(mode, compact):
    run = drive(Server(mode, gap=0.01, compact=compact), [SPEC])
    (r,) = run.records
    assert r.error is None
    assert (r.prompt_tokens, r.output_tokens) == (4, 5)
    # lower bounds only: the server sleeps 10 ms before each token, and a busy machine can only add to that
    assert len(r.itl) == 4 and all(g > 0.005 for g in r.itl)
    assert r.ttft > 0.005
    assert r.end - r.start == pytest.approx(r.ttft + sum(r.itl), abs=1e-9)  # ends at the last token
    assert run.started <= r.start and r.end <= run.ended


def test_request_body_is_what_vllm_expects():
    server = Server()
    drive(server, [SPEC])
    assert server.bodies == [{
        "model": "tiny", "prompt": [11, 12, 13, 14], "max_tokens": 5, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0,
    }]


def test_a_text_prompt_is_sent_as_the_string_and_its_length_is_the_servers_count():
    server = Server()
    (r,) = drive(server, [RequestSpec((11, 12, 13, 14), 5, "w11 w12 w13 w14")]).records
    assert server.bodies[0]["prompt"] == "w11 w12 w13 w14"
    assert r.error is None and r.prompt_tokens == len("w11 w12 w13 w14")  # this test server counts characters


def test_events_split_across_reads_and_bundled_in_one():
    (r,) = drive(Server(mode="split"), [SPEC]).records
    assert r.error is None and r.output_tokens == 6 and len(r.itl) == 5


@pytest.mark.parametrize(
    "mode, error",
    [
        ("http400", 'HTTP 400: {"error": {"message": "max_tokens is too large"}}'),
        ("no_done", "stream ended without [DONE]"),
        ("short", "short output: 4 of 5 tokens"),
        ("stream_error", "stream error: engine died"),
    ],
)
def test_failures_become_records(mode, error):
    run = drive(Server(mode=mode), [SPEC, SPEC])
    assert [r.error for r in run.records] == [error, error]


def test_timeout_becomes_a_record():
    (r,) = drive(Server(mode="hang"), [SPEC], request_timeout_s=0.3).records
    assert r.error == "timeout after 0.3 s" and 0.29 < r.end - r.start < 1.5


def test_a_stall_becomes_a_record_and_ends_the_level():
    # The hang server sends its headers and a ping, then nothing for 2 s: a stall of 0.5 s fails the request,
    # and a level whose requests all fail this way stops instead of waiting out every request in turn.
    run = drive(Server(mode="hang"), [SPEC] * 6, stall_timeout_s=0.5)
    assert [r.error for r in run.records] == ["no data for 0.5 s"]
    assert run.records[0].end - run.records[0].start < 1.5


def test_a_server_that_hangs_mid_level_ends_the_level_at_the_first_stall():
    # Three requests complete, then the server hangs: the level ends with one stall, not one per request left.
    server = Server(mode="hang_later")
    run = drive(server, [SPEC] * 12, stall_timeout_s=0.5)
    assert [r.error for r in run.records] == [None, None, None, "no data for 0.5 s"] and len(server.bodies) == 4
    assert run.stop_reason == "the server hung: no data for 0.5 s" and run.hung
    assert run.ended - run.started < 1.5


def test_one_stuck_request_on_a_busy_server_is_an_error_not_a_hang():
    # The second request gets nothing for 8 s while the other connection streams a token every 50 ms: the
    # server is busy, not hung; the stuck request fails alone and the level goes on to the end. (A stall of 1.5 s:
    # 30 token gaps, so a busy machine does not make a streaming request look stuck.)
    server = Server(mode="one_stuck", gap=0.05, stuck_s=8.0)
    specs = [RequestSpec((1, 2), 20)] * 6
    run = drive(server, specs, LoadLevel("concurrency", 2), stall_timeout_s=1.5)
    assert sorted(r.error or "" for r in run.records) == [""] * 5 + ["no data for 1.5 s"]
    assert run.stop_reason == "" and not run.hung


def test_a_stall_in_the_warm_up_ends_the_level_and_is_its_record():
    # A server that hangs before the level proper: one stall says it, not one more per measured request.
    server = Server(mode="hang", stuck_s=20.0)
    run = drive(server, [SPEC] * 6, LoadLevel("concurrency", 2), warmup=[SPEC] * 2, stall_timeout_s=0.5)
    assert [r.error for r in run.records] == ["no data for 0.5 s"] * 2 and len(server.bodies) == 2
    # ended at the stall, long before the server's 20 s would have let any request go on
    assert run.stop_reason == "the server hung: no data for 0.5 s" and run.ended - run.started < 10


def test_a_level_where_every_request_fails_gives_up_after_four():
    run = drive(Server(mode="http400"), [SPEC] * 20)
    assert len(run.records) == 4 and all(r.error and r.error.startswith("HTTP 400") for r in run.records)


def test_connection_refused_becomes_a_record():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the request: nothing listens
    run = measure_level(f"http://127.0.0.1:{port}", "tiny", [SPEC], LoadLevel("concurrency", 1))
    assert run.records[0].error.startswith("connection error: ")


def test_closed_loop_keeps_exactly_concurrency_in_flight_and_excludes_warmup():
    server = Server(gap=0.005)
    specs = [RequestSpec((20 + i,), 3) for i in range(12)]
    run = drive(server, specs, LoadLevel("concurrency", 3), warmup=[RequestSpec((1,), 2)] * 2)
    assert server.max_in_flight == 3
    assert len(server.bodies) == 14 and len(run.records) == 12
    assert all(r.error is None and r.output_tokens == 3 for r in run.records)
    assert [r.prompt_tokens for r in run.records] == [1] * 12


def test_rate_mode_poisson_arrivals_with_an_in_flight_cap():
    server = Server(gap=0.01)
    specs = [RequestSpec((20,), 4)] * 10
    run = drive(server, specs, LoadLevel("rate", 1000, max_in_flight=2))
    assert server.max_in_flight == 2 and all(r.error is None for r in run.records)
    slow = drive(Server(), specs, LoadLevel("rate", 20), seed=1)  # mean gap 50 ms
    starts = sorted(r.start for r in slow.records)
    assert 0.15 < starts[-1] - starts[0] < 1.5


@pytest.mark.parametrize("level", [LoadLevel("concurrency", 4), LoadLevel("rate", 1000)])
def test_a_conversations_next_turn_is_sent_once_its_answer_came(level):
    """As a chat user does: turn k+1 leaves after turn k's last token, whatever the level's other requests do."""
    server = Server(gap=0.01)
    specs = [RequestSpec((20 + i,), 3, conversation=i // 3) for i in range(9)]
    run = drive(server, specs, level)
    assert len(run.records) == 9 and all(r.error is None for r in run.records)
    assert server.max_in_flight == 3  # three conversations at once, one turn of each
    recs = run.records  # in the specs' order, in both modes
    for i in range(9):
        if i % 3:
            assert recs[i].start >= recs[i - 1].end


def test_a_replayed_log_keeps_its_arrival_shape_at_any_rate():
    from autotune.measure.client import due_times

    specs = [RequestSpec((20,), 2, at=at) for at in (5.0, 5.5, 9.0, 9.0)]  # a warm-up took the log's first lines
    assert due_times(specs, LoadLevel("rate", 1.0), 0) == [0.0, 0.5, 4.0, 4.0]
    assert due_times(specs, LoadLevel("rate", 2.0), 0) == [0.0, 0.25, 2.0, 2.0]  # twice the log's own rate
    poisson = [RequestSpec((20,), 2)] * 4
    assert due_times(poisson, LoadLevel("rate", 2.0), 7) == arrival_times(2.0, 4, 7)


def test_seeded_levels_offer_their_labelled_rate_on_average_and_each_level_its_own_schedule():
    """Pure arithmetic on the schedules a trial sends (Workload.arrival_seed per level, as trial._measure does):
    one fixed seed replayed one draw at every level, which offers 0.87x its label over 32 requests."""
    from autotune.measure.workload import Workload

    w = Workload(seed=0)
    for n, within in ((72, 0.03), (32, 0.05)):  # (n - 1) / window overstates by (n - 1) / (n - 2) on average
        offered = [offered_rate(arrival_times(4.0, n, w.arrival_seed(k))) for k in range(400)]
        assert abs(float(np.mean(offered)) / 4.0 - 1.0) < within, (n, np.mean(offered))
    first, second = (arrival_times(4.0, 72, w.arrival_seed(k)) for k in (0, 1))
    assert first != second
    assert arrival_times(4.0, 72, w.arrival_seed(1)) == second  # reproducible
    assert arrival_times(4.0, 72, Workload(seed=1).arrival_seed(0)) != first  # the workload's seed counts


def test_bad_levels_rejected():
    for mode, value in [("concurrency", 0), ("concurrency", 2.5), ("rate", -1), ("burst", 1)]:
        with pytest.raises(ValueError):
            LoadLevel(mode, value)  # type: ignore[arg-type]
