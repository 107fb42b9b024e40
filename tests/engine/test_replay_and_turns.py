"""A replayed request log and multi-turn conversations on the real vLLM CPU build, checked by what the server
counted (its /metrics: requests finished, their prompt tokens, prefix-cache hits) and by when the client sent each
request, not only by their having run. One server (prefix caching on) serves both tests."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from autotune.engine.models import model_vocab_size, resolve_model
from autotune.engine.server import EngineSpec, launch
from autotune.measure.client import LoadLevel, conversations, measure_level
from autotune.measure.workload import LengthDist, Workload

EAGER = {"enforce_eager": True, "load_format": "dummy", "dtype": "float32", "enable_prefix_caching": True}
PREFIX = 256  # a shared prefix of whole KV blocks whatever the block size (16 to 256 tokens)

COUNTERS = {  # what the server counted, as vLLM exports it
    "finished": ("vllm:request_prompt_tokens", "vllm:request_prompt_tokens_count"),
    "prompt_tokens": ("vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum"),
    "prefix_hits": ("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total"),
    "prefix_queries": ("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total"),
}


def server_counts(base_url: str) -> dict[str, float]:
    """The server's counters, summed over their labels."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    samples = [(family.name, s.name, s.value) for family in text_string_to_metric_families(text)
               for s in family.samples]
    return {key: sum(v for f, s, v in samples if (f, s) == want) for key, want in COUNTERS.items()}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, int]]:
    """(base URL, served model name, vocabulary size) of one tiny dense server with prefix caching."""
    model, defaults = resolve_model("tiny:dense")
    spec = EngineSpec(model, {**defaults, **EAGER}, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, boot_timeout_s=900)
    with launch(spec, tmp_path_factory.mktemp("replay") / "server.log") as (srv, _):
        yield srv.base_url, srv.model, model_vocab_size(model)


def test_a_replayed_log_arrives_as_logged_with_its_lengths_and_shared_prefix(server, tmp_path: Path) -> None:
    base_url, model, vocab = server
    # Two bursts of four, 3 s apart (timestamps as a log holds them: Unix seconds), every request opening with the
    # same 256-token system prompt: a mean rate of 7 requests over 3 s.
    log = tmp_path / "requests.jsonl"
    rows = [{"timestamp": 1_700_000_000.0 + (3.0 if i >= 4 else 0.0), "input_len": 300, "output_len": 4,
             "prefix": "system", "prefix_len": PREFIX} for i in range(8)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    requests = Workload(replay=log, seed=3).requests(8, vocab)
    before = server_counts(base_url)
    run = measure_level(base_url, model, requests, LoadLevel("rate", 7 / 3.0))  # the log's own rate
    after = server_counts(base_url)
    got = {k: after[k] - before[k] for k in COUNTERS}

    assert [r.error for r in run.records] == [None] * 8
    assert got["finished"] == 8 and got["prompt_tokens"] == 8 * 300
    # The second burst finds the system prompt cached (the first may race itself): at least 4 x 256 tokens hit.
    assert got["prefix_hits"] >= 4 * PREFIX and got["prefix_queries"] >= got["prefix_hits"]
    # Sent as logged: the first burst at once, the second never before its 3 s, so the one long gap is between them.
    sent = sorted(r.start - run.started for r in run.records)
    gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert sent[4] >= 3.0 and max(gaps) == gaps[3], sent


def test_conversation_turns_go_in_order_and_reuse_the_turns_before_them(server) -> None:
    base_url, model, vocab = server
    workload = Workload(LengthDist(mean=PREFIX), LengthDist(mean=8), turns=3, seed=5)
    requests = workload.requests(6, vocab)  # two conversations of three turns, token ids (exact lengths)
    before = server_counts(base_url)
    run = measure_level(base_url, model, requests, LoadLevel("concurrency", 2))
    after = server_counts(base_url)
    got = {k: after[k] - before[k] for k in COUNTERS}

    assert [r.error for r in run.records] == [None] * 6
    assert got["finished"] == 6 and got["prompt_tokens"] == sum(s.prompt_len for s in requests)
    # Turn k resends turn k-1's prompt (and a drawn answer): its whole blocks hit the cache, 256 tokens for the
    # second turn, 512 of the 520 for the third (256 + 8 + 256), in each of the two conversations.
    assert [s.prompt_len for s in requests[:3]] == [PREFIX, 2 * PREFIX + 8, 3 * PREFIX + 16]
    assert got["prefix_hits"] >= 2 * (PREFIX + 2 * PREFIX), got
    # A conversation's next turn leaves once the answer to the one before it came (records are in request order).
    assert [r.prompt_tokens for r in run.records] == [s.prompt_len for s in requests]
    for unit in conversations(requests):
        turns = [run.records[i] for i in unit]
        assert len(turns) == 3 and all(b.start >= a.end for a, b in zip(turns, turns[1:], strict=False))
