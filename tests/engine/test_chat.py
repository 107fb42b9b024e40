"""Chat traffic on the real vLLM CPU build: requests go to /v1/chat/completions, the server renders them with the
tiny model's chat template, and the client times them as it times completions."""

from __future__ import annotations

from pathlib import Path

from autotune.engine.models import model_vocab_size, resolve_model
from autotune.engine.server import EngineSpec, launch
from autotune.measure.client import LoadLevel, measure_level
from autotune.measure.stats import Limits, level_stats
from autotune.measure.workload import LengthDist, Workload, prompt_decoder

EAGER = {"enforce_eager": True, "load_format": "dummy", "dtype": "float32", "enable_prefix_caching": True}


def test_chat_conversations_go_to_chat_completions_through_the_models_template(tmp_path: Path) -> None:
    model, defaults = resolve_model("tiny:dense")
    spec = EngineSpec(model, {**defaults, **EAGER}, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, boot_timeout_s=600)
    workload = Workload(LengthDist(mean=16), LengthDist(mean=4), api="chat", turns=2, seed=1)
    requests = workload.requests(6, model_vocab_size(model), decode=prompt_decoder(model))
    with launch(spec, tmp_path / "server.log") as (server, _):
        run = measure_level(server.base_url, server.model, requests, LoadLevel("concurrency", 2), chat=True)
    assert [r.error for r in run.records] == [None] * 6
    # 4 tokens each, counted from the usage vLLM reports; on a loaded machine the server may send two in one chunk,
    # so a request has at most 3 gaps between chunks, not always 3
    assert all(r.output_tokens == 4 and r.ttft is not None and 1 <= len(r.itl) <= 3 for r in run.records)
    # The server's count: each message's words plus the template's <|im_start|> and <|im_end|> (2 per message);
    # a second turn resends the first (16 words), its answer (4) and a new message (16).
    assert [r.prompt_tokens for r in run.records] == [18, 42] * 3
    log = (tmp_path / "server.log").read_text()
    assert log.count("POST /v1/chat/completions HTTP/1.1\" 200") == 6 and "POST /v1/completions" not in log
    stats = level_stats(run, Limits(p95_ttft_ms=60_000))
    assert stats.completed == 6 and stats.output_tokens == 24 and stats.ttft.p95_ms > 0
