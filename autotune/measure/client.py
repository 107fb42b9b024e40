"""The async streaming client: one load level -> per-request records.

It times requests the way `vllm bench serve` does (TTFT = first chunk carrying a token, ITL = the gaps between
later chunks, latency ends at the last token), so its numbers can be compared with vLLM's own. A request that
fails becomes a record with `error` set: a failing configuration is data, not an exception.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
import numpy as np

from autotune.measure.workload import RequestSpec


@dataclass(frozen=True)
class LoadLevel:
    """Closed loop with `value` requests in flight, or Poisson arrivals at `value` requests per second.

    `max_in_flight` caps concurrent requests in rate mode (None: no cap).
    """

    mode: Literal["concurrency", "rate"]
    value: float
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("concurrency", "rate"):
            raise ValueError(f"unknown load mode {self.mode!r}")
        if self.value <= 0 or (self.mode == "concurrency" and self.value != int(self.value)):
            raise ValueError(f"bad {self.mode} level {self.value!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")

    @property
    def in_flight_limit(self) -> int | None:
        """The most requests in flight at once (None: unbounded)."""
        return int(self.value) if self.mode == "concurrency" else self.max_in_flight


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds from time.perf_counter().

    `end` is the arrival of the last token (as in vLLM's client), or the moment a failed request gave up.
    """

    start: float
    ttft: float | None
    itl: list[float]
    end: float
    prompt_tokens: int
    output_tokens: int
    error: str | None


@dataclass(frozen=True)
class LevelRun:
    """The measured requests of one level (warm-up excluded) and the level's wall-clock span.

    `stop_reason`: why the level ended before every request given was sent ("" when it did not): what the
    `enough` callback answered, or that the server failed every request, or that it hung."""

    level: LoadLevel
    records: list[RequestRecord] = field(hash=False)
    started: float
    ended: float
    stop_reason: str = ""
    # An abandoned level's requests in flight, cancelled: TTFT as known, or the wait so far (a lower bound), and
    # `end` when they were dropped. Their latencies count as lower bounds (level_stats), nothing else.
    dropped: tuple[RequestRecord, ...] = field(default=(), hash=False)

    @property
    def hung(self) -> bool:
        return self.stop_reason.startswith(HUNG)


# Called with the requests finished so far (in order of completion), the requests in flight (their `ttft` set once
# their first token came) and the time now; a non-empty answer stops sending more: requests in flight still finish
# and are recorded, unless the answer is an Abandon.
Enough = Callable[[Sequence[RequestRecord], Sequence[RequestRecord], float], str | None]


DROPPED = "dropped: the level clearly failed"  # the error of a request in flight when its level was abandoned


class Abandon(str):
    """An answer to `enough` after which the requests in flight can change nothing (a level that clearly fails):
    they are cancelled, not waited for, and kept apart (LevelRun.dropped) with the latency they had reached. A
    closed loop's last round on a slow server takes as long as the level (seen on the H200: 126 s for a screening
    level whose verdict was clear after the first few)."""


GIVE_UP_AFTER = 4  # requests that all failed: a server answering errors has said all a level can say
STALLED = "no data for"  # the error of a request the server stopped sending to
HUNG = "the server hung"  # a level's stop reason when no request received anything for the stall timeout


class _Finished:
    """Requests finished so far, when the server last sent anything, and whether to stop sending."""

    def __init__(self, enough: Enough | None, stall_s: float | None = None):
        self.enough, self.stall_s = enough, stall_s
        self.records: list[RequestRecord] = []
        self.in_flight: dict[int, RequestRecord] = {}  # by id(): sent, not finished
        self.reason = ""
        self.abandoned = asyncio.Event()  # set with an Abandon reason: the level stops waiting for its requests
        self.dropped: tuple[RequestRecord, ...] = ()  # then: the requests in flight, as far as they got
        self.heard_at = time.perf_counter()  # the last time any request of the level received data

    def sent(self, rec: RequestRecord) -> None:
        self.in_flight[id(rec)] = rec

    def add(self, rec: RequestRecord) -> None:
        self.in_flight.pop(id(rec), None)
        self.records.append(rec)
        if self.reason:
            return
        silent = self.stall_s is not None and time.perf_counter() - self.heard_at >= 0.9 * self.stall_s
        if (rec.error or "").startswith(STALLED) and silent:
            # Nothing on any connection for the stall timeout: hung, not busy (an overloaded server still streams
            # to the requests it runs). Each request still to send would only cost one more stall timeout.
            self.reason = f"{HUNG}: {rec.error}"
        elif all(r.error is not None for r in self.records) and len(self.records) >= GIVE_UP_AFTER:
            # A server that fails every request (answering errors) has said all a level can say.
            self.reason = f"the first {len(self.records)} request(s) all failed"
        elif self.enough is not None:
            now = time.perf_counter()
            self.reason = self.enough(self.records, list(self.in_flight.values()), now) or ""
            if isinstance(self.reason, Abandon):
                self.dropped = tuple(RequestRecord(r.start, r.ttft if r.ttft is not None else now - r.start, [], now,
                                                   r.prompt_tokens, 0, DROPPED) for r in self.in_flight.values())
                self.abandoned.set()


# The server-sent events' markers. A chunk with a non-empty `choices` list and no usage carries a token: recognised
# without parsing its JSON (inside JSON strings quotes are escaped, so these byte patterns cannot come from generated
# text); a chat stream's first chunk names the speaker (_ROLE) and carries none.
_DATA, _DONE = b"data:", b"[DONE]"
_TOKEN, _USAGE = b'"choices":[{', b'"usage":{'
_ROLE = b'"delta":{"role":"assistant","content":""}'
COMPLETIONS_PATH, CHAT_PATH = "/v1/completions", "/v1/chat/completions"


def request_body(model: str, spec: RequestSpec, *, chat: bool) -> bytes:
    """The JSON body of one streaming request: the prompt (ids or text) for /v1/completions, or the conversation
    as messages for /v1/chat/completions, which the server renders with the model's chat template."""
    body: dict[str, object] = {"model": model}
    if chat:
        roles = ("user", "assistant")
        turns = [*spec.history, spec.prompt_text]
        body["messages"] = [{"role": roles[i % 2], "content": text} for i, text in enumerate(turns)]
        body["max_completion_tokens"] = spec.max_tokens
    else:
        body["prompt"] = spec.prompt_token_ids if spec.prompt_text is None else spec.prompt_text
        body["max_tokens"] = spec.max_tokens
    body.update(ignore_eos=True, stream=True, stream_options={"include_usage": True}, temperature=0)
    return json.dumps(body, separators=(",", ":")).encode()


async def _send(
    session: aiohttp.ClientSession, url: str, model: str, spec: RequestSpec, timeout: aiohttp.ClientTimeout,
    finished: _Finished,
) -> RequestRecord:
    """Send one streaming completion (or chat completion) and time it; never raises (except cancellation)."""
    body = request_body(model, spec, chat=url.endswith(CHAT_PATH))
    rec = RequestRecord(time.perf_counter(), None, [], 0.0, spec.prompt_len, 0, None)
    finished.sent(rec)
    stream = _Stream(last=rec.start)
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                timeout=timeout) as resp:
            if resp.status != 200:
                text = (await resp.text(errors="replace")).strip()
                rec.error = f"HTTP {resp.status}: {text[:300]}"
            else:
                await _read_stream(resp, rec, stream, finished)
    except Exception as e:  # noqa: BLE001 - a request must come back as a record, whatever went wrong
        rec.error = _request_error(e, timeout)
    _settle(rec, stream, spec)
    return rec


@dataclass
class _Stream:
    """What a response stream carried so far: token chunks, the server's count of them, the last one's time."""

    last: float
    chunks: int = 0
    usage_tokens: int | None = None
    done: bool = False


async def _read_stream(resp: aiohttp.ClientResponse, rec: RequestRecord, stream: _Stream,
                       finished: _Finished) -> None:
    """Time each token chunk of the server-sent events as it arrives, until [DONE] or an error event."""
    buf = b""
    async for got in resp.content.iter_any():
        now = finished.heard_at = time.perf_counter()  # events that arrive in one read share it
        buf += got
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            if not raw.startswith(_DATA):
                continue  # blank separators, comments (": ping"), event/id fields
            payload = raw[5:].strip()
            if _ROLE in payload and _USAGE not in payload:
                continue  # a chat stream's first chunk names the speaker and carries no token
            if _TOKEN in payload and _USAGE not in payload:
                data = None  # fast path: a token chunk; its content is not needed
            elif payload == _DONE:
                stream.done = True
                break
            else:
                data = json.loads(payload)
                if err := data.get("error"):
                    msg = err.get("message", err) if isinstance(err, dict) else err
                    rec.error = f"stream error: {msg}"
                    break
                if usage := data.get("usage"):
                    stream.usage_tokens = usage.get("completion_tokens")
                    rec.prompt_tokens = usage.get("prompt_tokens") or rec.prompt_tokens
            if data is None or data.get("choices"):
                if stream.chunks:
                    rec.itl.append(now - stream.last)
                else:
                    rec.ttft = now - rec.start
                stream.last = now
                stream.chunks += 1
        if stream.done or rec.error:
            return


def _request_error(e: Exception, timeout: aiohttp.ClientTimeout) -> str:
    """A request's failure in one line."""
    if isinstance(e, aiohttp.ServerTimeoutError):  # sock_read: the server sent nothing for stall_timeout_s (hung)
        return f"{STALLED} {timeout.sock_read:g} s"
    if isinstance(e, TimeoutError):
        return f"timeout after {timeout.total:g} s"
    if isinstance(e, aiohttp.ClientResponseError):
        return f"HTTP {e.status}: {e.message}"
    if isinstance(e, aiohttp.ClientError):
        return f"connection error: {type(e).__name__}: {e}"
    if isinstance(e, ValueError | AttributeError):  # a line that is not the JSON vLLM sends
        return f"bad stream data: {e}"
    return f"{type(e).__name__}: {e}"


def _settle(rec: RequestRecord, stream: _Stream, spec: RequestSpec) -> None:
    """The record's output tokens (the server's usage count, else the chunks seen), what a stream that ended
    without an error lacked, and its end: the last token's time, or now for a failed request."""
    rec.output_tokens = stream.usage_tokens if stream.usage_tokens is not None else stream.chunks
    if rec.error is None:
        if not stream.done:
            rec.error = "stream ended without [DONE]"
        elif rec.ttft is None:
            rec.error = "stream carried no tokens"
        elif rec.output_tokens < spec.max_tokens:
            rec.error = f"short output: {rec.output_tokens} of {spec.max_tokens} tokens"
    rec.end = stream.last if rec.error is None else time.perf_counter()


def conversations(specs: Sequence[RequestSpec]) -> list[list[int]]:
    """The indices of `specs` in sending units: the turns of one conversation (consecutive specs with the same
    `conversation`) go one after another, as a chat user sends the next turn once the answer came; others alone."""
    units: list[list[int]] = []
    for i, spec in enumerate(specs):
        if units and spec.conversation is not None and specs[units[-1][0]].conversation == spec.conversation:
            units[-1].append(i)
        else:
            units.append([i])
    return units


async def _closed_loop(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    specs: Sequence[RequestSpec],
    concurrency: int,
    timeout: aiohttp.ClientTimeout,
    done: _Finished,
) -> list[RequestRecord]:
    """`concurrency` workers, each sending its next request (or conversation) as soon as its last one ends (until
    `done` says stop: then the requests not yet sent are left out)."""
    records: list[RequestRecord | None] = [None] * len(specs)
    units = iter(conversations(specs))

    async def worker() -> None:
        for unit in units:
            for i in unit:
                rec = records[i] = await _send(session, url, model, specs[i], timeout, done)
                done.add(rec)
                if done.reason:
                    return

    await _until_abandoned([asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(specs)))], done)
    return [r for r in records if r is not None]


def arrival_times(rate: float, n: int, seed: int | Sequence[int]) -> list[float]:
    """When each of `n` requests is due, in seconds after the first: a Poisson process at `rate` requests/s.

    One draw per seed: a caller that gives every level the same seed replays one schedule, and with it one
    sampling error of the offered rate (seed 0 offers 0.87x the label over 32 requests, 0.98x over 72), so
    trials seed each level (Workload.arrival_seed)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, max(n - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:n]


def due_times(specs: Sequence[RequestSpec], level: LoadLevel, seed: int | Sequence[int]) -> list[float]:
    """When each sending unit (conversations()) is due, in seconds after the first: a replayed log's own arrival
    times scaled to the level's rate, else a Poisson process at that rate."""
    firsts = [specs[unit[0]] for unit in conversations(specs)]
    if firsts and firsts[0].at is not None:
        return [(s.at - firsts[0].at) / level.value for s in firsts if s.at is not None]
    return arrival_times(level.value, len(firsts), seed)


async def _poisson(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    specs: Sequence[RequestSpec],
    level: LoadLevel,
    timeout: aiohttp.ClientTimeout,
    seed: int | Sequence[int],
    done: _Finished,
) -> list[RequestRecord]:
    """Requests (or conversations, whose later turns follow their answers) arrive at exponential intervals (mean
    1/rate) or a replayed log's, optionally queued behind an in-flight cap.

    As in vLLM's client, a request held back by the cap is timed from when it is sent, not from its arrival.
    """
    units = conversations(specs)
    due = due_times(specs, level, seed)
    cap = asyncio.Semaphore(level.max_in_flight) if level.max_in_flight else None

    async def one(spec: RequestSpec) -> RequestRecord | None:
        if cap is None:
            rec = await _send(session, url, model, spec, timeout, done)
        else:
            async with cap:
                if done.reason:  # arrived, but still queued behind the cap when the level had enough
                    return None
                rec = await _send(session, url, model, spec, timeout, done)
        done.add(rec)
        return rec

    async def turns(unit: list[int]) -> list[RequestRecord]:
        recs = []
        for i in unit:
            if (rec := await one(specs[i])) is None:
                break
            recs.append(rec)
            if done.reason:
                break
        return recs

    tasks = []
    t0 = time.perf_counter()
    for unit, at in zip(units, due, strict=True):  # due_times gives one time per unit
        if (delay := t0 + at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        if done.reason:
            break
        tasks.append(asyncio.ensure_future(turns(unit)))
    await _until_abandoned(tasks, done)
    return [r for t in tasks if not t.cancelled() for r in t.result()]


async def _until_abandoned(tasks: Sequence[asyncio.Future], done: _Finished) -> None:
    """Wait for `tasks`; once the level is abandoned, cancel those still running (their requests are dropped)."""
    abandoned = asyncio.ensure_future(done.abandoned.wait())
    waiting = set(tasks)
    while waiting and not done.abandoned.is_set():
        finished, _ = await asyncio.wait([*waiting, abandoned], return_when=asyncio.FIRST_COMPLETED)
        waiting -= finished
    abandoned.cancel()
    for t in waiting:
        t.cancel()
    await asyncio.gather(*tasks, abandoned, return_exceptions=True)


async def run_level(
    base_url: str,
    model: str,
    requests: Sequence[RequestSpec],
    level: LoadLevel,
    *,
    warmup: Sequence[RequestSpec] = (),
    request_timeout_s: float = 300,
    stall_timeout_s: float | None = 60,
    seed: int | Sequence[int] = 0,
    enough: Enough | None = None,
    chat: bool = False,
) -> LevelRun:
    """Send `warmup` (not recorded), then `requests` at `level`; every request sent comes back as a record.
    With `enough`, sending stops once it answers (the rest of `requests` is a reserve, not a quota). `seed`
    draws the rate mode's arrival schedule (arrival_times).

    A request that receives nothing for `stall_timeout_s` fails (a hung server costs a minute, not the total).
    `chat`: send to /v1/chat/completions (the requests' text as messages), else /v1/completions."""
    url = base_url.rstrip("/") + (CHAT_PATH if chat else COMPLETIONS_PATH)
    limit = level.in_flight_limit
    connector = aiohttp.TCPConnector(limit=limit or 0, limit_per_host=limit or 0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_read=stall_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if warmup:
            warm, started = _Finished(None, stall_timeout_s), time.perf_counter()
            records = await _closed_loop(session, url, model, warmup, limit or len(warmup), timeout, warm)
            if warm.reason:  # every warm-up request failed (a hung or broken server): the level would repeat it
                return LevelRun(level, records, started, time.perf_counter(), warm.reason)
        finished = _Finished(enough, stall_timeout_s)
        started = time.perf_counter()
        if level.mode == "concurrency":
            records = await _closed_loop(session, url, model, requests, int(level.value), timeout, finished)
        else:
            records = await _poisson(session, url, model, requests, level, timeout, seed, finished)
        ended = time.perf_counter()
    return LevelRun(level, records, started, ended, finished.reason, finished.dropped)


def measure_level(
    base_url: str,
    model: str,
    requests: Sequence[RequestSpec],
    level: LoadLevel,
    *,
    warmup: Sequence[RequestSpec] = (),
    request_timeout_s: float = 300,
    stall_timeout_s: float | None = 60,
    seed: int | Sequence[int] = 0,
    enough: Enough | None = None,
    chat: bool = False,
) -> LevelRun:
    """Synchronous `run_level` (its own event loop) for callers that are not async."""
    return asyncio.run(
        run_level(
            base_url, model, requests, level, warmup=warmup, request_timeout_s=request_timeout_s,
            stall_timeout_s=stall_timeout_s, seed=seed, enough=enough, chat=chat,
        )
    )
