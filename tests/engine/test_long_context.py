"""Long-context traffic on the real vLLM CPU build: the scaled-down long-context objective's chat prompts, cut to
the server's max_model_len, are all served where the same prompts uncut are refused (HTTP 400)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autotune.config.objective import load_objective
from autotune.engine.models import model_vocab_size, resolve_model
from autotune.engine.server import EngineSpec, launch
from autotune.measure.client import LoadLevel, measure_level
from autotune.measure.workload import prompt_decoder, prompt_encoder

ROOT = Path(__file__).resolve().parents[2]
OBJECTIVE = ROOT / "tests" / "data" / "workloads" / "long-context-objective.toml"
EAGER = {"enforce_eager": True, "load_format": "dummy", "dtype": "float32", "enable_prefix_caching": True}


def test_long_prompts_cut_to_the_context_are_served_where_uncut_ones_are_refused(tmp_path: Path) -> None:
    model, defaults = resolve_model("tiny:dense")
    context = 1024
    spec = EngineSpec(model, {**defaults, **EAGER, "max_model_len": context}, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                      boot_timeout_s=600)
    workload = load_objective(OBJECTIVE).workload
    vocab, encode, decode = model_vocab_size(model), prompt_encoder(model), prompt_decoder(model)
    cut = workload.requests(6, vocab, tokenize=encode, decode=decode, context=context)
    whole = replace(workload, clip_to_context=False).requests(6, vocab, tokenize=encode, decode=decode)
    longer = [i for i, r in enumerate(whole) if r.prompt_len + r.max_tokens > context]
    assert longer, "the draw must hold prompts longer than the context"
    with launch(spec, tmp_path / "server.log") as (server, _):
        served = measure_level(server.base_url, server.model, cut, LoadLevel("concurrency", 2), chat=True)
        refused = measure_level(server.base_url, server.model, whole, LoadLevel("concurrency", 2), chat=True)
    assert [r.error for r in served.records] == [None] * 6
    # The server's count: the prompt cut to the context less the answer and the chat template's room, the shared
    # prefix first; the longest reach the cut.
    assert all(r.prompt_tokens is not None and r.prompt_tokens <= context - 16 for r in served.records)
    assert max(r.prompt_tokens or 0 for r in served.records) >= context - 16 - 64
    # The same prompts uncut: each longer than the context is refused (the client stops a level whose every
    # request fails once a few have, so it may not have sent them all).
    sent = [i for i in longer if i < len(refused.records)]
    assert sent and all("400" in (refused.records[i].error or "") for i in sent), refused.records
