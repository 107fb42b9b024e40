"""The side-by-side replay's one log in two formats (benchmarks/client_replay_vs_vllm_bench.py): autotune's request-log
replay and vLLM's own timed-trace reader, each reading its file, must describe the same requests at the same
times, or the comparison would send the two clients different loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.engine.models import VOCAB_SIZE, write_tiny_model
from autotune.measure.client import LoadLevel, due_times
from autotune.measure.workload import Workload
from benchmarks.client_replay_vs_vllm_bench import write_trace
from benchmarks.client_vs_vllm_bench import SHAPES


@pytest.mark.parametrize("workload", ["long", "variable"])
def test_both_clients_read_the_same_requests_at_the_same_times(workload: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets.datasets import TimedTrace

    shape = SHAPES[workload]
    trace = write_trace(shape, 1.2, seed=3, folder=tmp_path)
    ours = Workload(replay=trace.log, prompt="token_ids").requests(trace.requests, VOCAB_SIZE)
    ours_due = due_times(ours, LoadLevel("rate", trace.rate), seed=0)

    tokenizer = AutoTokenizer.from_pretrained(str(write_tiny_model("dense", tmp_path / "tiny")))
    theirs = TimedTrace(dataset_path=str(trace.timed_trace), random_seed=0, timed_trace_chunk_hash_size=512,
                        timed_trace_label_timestamp="timestamp", timed_trace_label_input_length="input_len",
                        timed_trace_label_output_length="output_len", timed_trace_label_hash_ids="hash_ids",
                        ).sample(tokenizer, trace.requests)

    assert len(ours) == len(theirs) == shape.prompts
    assert [s.prompt_len for s in ours] == [r.prompt_len for r in theirs]
    assert [s.max_tokens for s in ours] == [r.expected_output_len for r in theirs] == [shape.output_len] * len(ours)
    assert ours_due == pytest.approx([r.timestamp for r in theirs], abs=1e-5)
    if workload == "variable":  # lengths drawn, not one length for all
        assert len({s.prompt_len for s in ours}) > 10
    # No two requests share a prompt block (prefix caching off or on, neither client's prompts hit a cache).
    assert len({tuple(r.prompt[:512]) for r in theirs}) == len(theirs)
