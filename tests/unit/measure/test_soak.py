"""The soak's verdict on recorded samples: request errors, empty replies, memory growth past what vLLM reserved
(the ready reading on a GPU, the peak of the warm-up quarter on the CPU build's RSS)."""

from __future__ import annotations

from autotune.measure.client import RequestRecord
from autotune.measure.soak import (
    EMPTY,
    GROWTH_MIN_BYTES,
    MemorySample,
    Soak,
    count_replies,
    memory_after_warm_up,
)

GIB = 2**30


def soak(**kw: object) -> Soak:
    fields: dict[str, object] = {"seconds": 120.0, "level": "concurrency 14", "requests": 240, "errors": 0,
                                 "empty": 0, "source": "nvml", "reserved_bytes": 22 * GIB,
                                 "peak_bytes": 22 * GIB + 50 * 2**20}
    return Soak(**(fields | kw))  # type: ignore[arg-type]


def reply(error: str | None = None, tokens: int = 64) -> RequestRecord:
    return RequestRecord(0.0, 0.1 if tokens else None, [], 1.0, 256, tokens, error)


def test_a_winner_that_served_without_error_and_within_its_memory_holds_up():
    s = soak()
    assert s.verdict == ""
    assert s.text == ("soaked 120 s at concurrency 14: 240 requests, no error, no empty reply, memory within what "
                      "vLLM reserved (+0.05 GiB)")


def test_errors_empty_replies_and_a_server_that_never_served_fail_the_soak():
    assert soak(errors=3, first_error="HTTP 500").verdict == "3 of 240 requests errored (HTTP 500)"
    assert soak(empty=2).verdict == "2 of 240 replies were empty"
    assert soak(requests=0).verdict == "no request completed"
    failed = soak(failure="the server died: out of memory")
    assert failed.verdict == "the server died: out of memory"
    assert failed.text == "failed its soak: the server died: out of memory"


def test_memory_growth_past_what_vllm_reserved_fails_beyond_two_percent():
    # 22 GiB reserved: 2% is 0.44 GiB; 0.4 GiB of growth passes, 0.6 GiB fails
    assert soak(peak_bytes=22 * GIB + int(0.4 * GIB)).verdict == ""
    grew = soak(peak_bytes=22 * GIB + int(0.6 * GIB))
    assert grew.verdict == "its memory grew 0.60 GiB past what vLLM reserved (22.00 GiB)"
    # a small CPU server: at least GROWTH_MIN_BYTES
    small = soak(source="rss", reserved_bytes=3 * GIB, peak_bytes=3 * GIB + 100 * 2**20)
    assert small.allowed_growth_bytes == GROWTH_MIN_BYTES
    assert small.verdict == "" and soak(source="rss", reserved_bytes=3 * GIB, peak_bytes=3 * GIB + 200 * 2**20).verdict


def test_what_vllm_reserved_is_the_ready_reading_on_a_gpu_and_the_warm_up_peak_on_the_cpu_build():
    # Recorded RSS of a CPU server: the KV cache's pages are touched during the first quarter (to 3.10 GiB), then
    # it stays flat; on a GPU the same readings would be growth past the ready reading.
    samples = [MemorySample(t, int(b * GIB)) for t, b in
               [(1, 2.90), (4, 3.05), (7, 3.10), (15, 3.08), (20, 3.09), (28, 3.10)]]
    assert memory_after_warm_up(samples, int(2.80 * GIB), "rss", 30.0) == (int(3.10 * GIB), int(3.10 * GIB))
    reserved, peak = memory_after_warm_up(samples, int(2.80 * GIB), "nvml", 30.0)
    assert (reserved, peak) == (int(2.80 * GIB), int(3.10 * GIB))
    leaking = [MemorySample(t, int((3.0 + 0.01 * t) * GIB)) for t in range(1, 121)]  # +10 MiB a second
    reserved, peak = memory_after_warm_up(leaking, int(3.0 * GIB), "rss", 120.0)
    s = soak(source="rss", reserved_bytes=reserved, peak_bytes=peak)
    assert s.verdict.startswith("its memory grew 0.90 GiB past what vLLM reserved")
    assert memory_after_warm_up([], 5, "rss", 30.0) == (5, None)


def test_replies_are_counted_as_errored_or_empty():
    records = [reply(), reply(EMPTY, tokens=0), reply("HTTP 500"), reply(), reply("stream ended without [DONE]")]
    assert count_replies(records) == (2, 1, "HTTP 500")
    assert count_replies([reply(), reply()]) == (0, 0, "")


def test_the_record_round_trips():
    s = soak(errors=1, first_error="timeout")
    assert Soak.from_attr(s.as_attr()) == s
