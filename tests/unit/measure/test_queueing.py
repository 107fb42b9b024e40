"""The queue wait no kernel can shorten (measure/queueing.py), on the stop-21 device run's figures: the
Qwen3.5-27B AWQ shape (17.246 GiB of weights predicted and loaded), the chat objective, the incumbent's level 36."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config.objective import load_objective
from autotune.config.study_file import load_study
from autotune.fit.estimate import Estimate
from autotune.fit.hardware import PROFILES
from autotune.measure.ladder import Prior
from autotune.measure.queueing import cannot_sustain, holds_too_few, least_queue_wait
from autotune.measure.stats import Limits
from autotune.search import record, tell
from autotune.search.screen import screen_before_boot
from autotune.units import GiB

ROOT = Path(__file__).resolve().parents[3]
CHAT = load_objective(ROOT / "objectives" / "chat-p95.toml")
WEIGHTS = int(17.246 * GiB)


@pytest.mark.parametrize(("card", "screened"), [("h200", {1, 6}), ("rtx3090", {1, 6, 16, 18})])
def test_the_device_runs_screened_configurations_that_need_not_have_booted(card, screened) -> None:
    """The four sampled configurations below the level were all screened out after booting (99-123 s each)."""
    bandwidth = PROFILES[card].bandwidth_gbs
    said = {seqs for seqs in (1, 6, 16, 18, 36, 64, 106)
            if cannot_sustain(36, {"max_num_seqs": seqs}, WEIGHTS, bandwidth, CHAT.workload, CHAT.limits)}
    assert said == screened


def test_the_wait_is_littles_law_on_the_least_service_time() -> None:
    wait = least_queue_wait(36, {"max_num_seqs": 6}, WEIGHTS, 4800.0, CHAT.workload)
    assert wait is not None
    assert wait.step_s == pytest.approx(WEIGHTS / 4.8e12)  # 3.9 ms: the weights read once per decode step
    assert wait.service_s == pytest.approx(127 * wait.step_s)  # the chat objective's answers are >= 128 tokens
    assert wait.wait_s == pytest.approx(30 / 6 * wait.service_s)
    text = cannot_sustain(36, {"max_num_seqs": 6}, WEIGHTS, 4800.0, CHAT.workload, CHAT.limits)
    assert text is not None and "max_num_seqs 6 holds 6 of the incumbent's 36" in text and "2.4 s each" in text


def test_nothing_is_said_without_a_certain_bound() -> None:
    w, lim = CHAT.workload, CHAT.limits
    assert cannot_sustain(36, {}, WEIGHTS, 936.0, w, lim) is None  # vLLM's own max_num_seqs
    assert cannot_sustain(36, {"max_num_seqs": 1}, WEIGHTS, 0.0, w, lim) is None  # no bandwidth: the CPU build
    assert cannot_sustain(36, {"max_num_seqs": 1}, WEIGHTS, 936.0, w, Limits(p95_tpot_ms=100)) is None
    assert cannot_sustain(36, {"max_num_seqs": 1}, WEIGHTS, 936.0, replace(w, dataset=Path("p.jsonl")), lim) is None
    assert cannot_sustain(36, {"max_num_seqs": 1}, WEIGHTS, 936.0, replace(w, replay=Path("log.jsonl")), lim) is None
    # speculative decoding: up to 1 + k tokens a step, so the least service time shrinks as much
    spec = {"max_num_seqs": 18, "speculative_config": {"method": "mtp", "num_speculative_tokens": 3}}
    plain = least_queue_wait(36, {"max_num_seqs": 18}, WEIGHTS, 936.0, w)
    drafted = least_queue_wait(36, spec, WEIGHTS, 936.0, w)
    assert plain is not None and drafted is not None and drafted.wait_s == pytest.approx(plain.wait_s / 4)
    assert cannot_sustain(36, spec, WEIGHTS, 936.0, w, lim) is None


def test_the_kv_cache_bounds_what_runs_at_once_where_max_num_seqs_does_not() -> None:
    """The device's surface #13: max_num_seqs 66, but its 63 KV blocks (the estimate's optimistic end: 17 requests
    of one attention and three Gated DeltaNet blocks) ran 16 chat requests and failed 32 (p95 TTFT 6.5 s). On a
    3090's bandwidth even the least wait says so before a boot; on the H200's it is too short to."""
    flags = {"max_num_seqs": 66}
    assert cannot_sustain(32, flags, WEIGHTS, 936.0, CHAT.workload, CHAT.limits) is None
    text = cannot_sustain(32, flags, WEIGHTS, 936.0, CHAT.workload, CHAT.limits, pool_seqs=17)
    assert text is not None and text.startswith("the KV cache (a block of each of its groups per request) holds 17 "
                                                 "of the incumbent's 32")
    wait = least_queue_wait(32, flags, WEIGHTS, 936.0, CHAT.workload, pool_seqs=17)
    assert wait is not None and wait.wait_s == pytest.approx(15 / 17 * 127 * WEIGHTS / 936e9)
    assert cannot_sustain(16, flags, WEIGHTS, 936.0, CHAT.workload, CHAT.limits, pool_seqs=17) is None
    assert cannot_sustain(32, flags, WEIGHTS, 4800.0, CHAT.workload, CHAT.limits, pool_seqs=17) is None
    # the smaller of the two bounds holds: max_num_seqs 6 below a pool of 17
    six = least_queue_wait(32, {"max_num_seqs": 6}, WEIGHTS, 936.0, CHAT.workload, pool_seqs=17)
    assert six is not None and six.slots == 6 and six.held_by == "max_num_seqs 6"
    # vLLM's own max_num_seqs (unset): the pool alone bounds it
    assert least_queue_wait(32, {}, WEIGHTS, 936.0, CHAT.workload, pool_seqs=17) is not None


def test_only_a_screened_sampled_configuration_is_screened_before_boot() -> None:
    spec = load_study(ROOT / "studies" / "qwen3.5-27b-rtx3090.toml")
    card, flags = PROFILES["rtx3090"], {"max_num_seqs": 16}
    est = _estimate(weights_bytes=WEIGHTS, max_running_seqs=0)
    assert screen_before_boot(Prior(incumbent=36, screen=True), flags, est, card, spec) is not None
    assert screen_before_boot(Prior(incumbent=36, screen=False), flags, est, card, spec) is None  # a baseline
    assert screen_before_boot(Prior(screen=True), flags, est, card, spec) is None  # no incumbent yet
    # the KV cache's bound, unless the estimator does not model the configuration's cache
    roomy = {"max_num_seqs": 64}
    assert screen_before_boot(Prior(incumbent=36, screen=True), roomy, est, card, spec) is None
    small = _estimate(weights_bytes=WEIGHTS, max_running_seqs=12)
    assert "the KV cache" in (screen_before_boot(Prior(incumbent=36, screen=True), roomy, small, card, spec) or "")
    unknown = replace(small, not_modelled=("kv_cache_dtype fp8_e5m2",))
    assert screen_before_boot(Prior(incumbent=36, screen=True), roomy, unknown, card, spec) is None


def test_a_configuration_running_under_seven_eighths_of_the_incumbents_level_is_not_booted() -> None:
    """holds_too_few: 13 of 16 at once is screened out before boot, 14 boots (the recorded surfaces' split,
    benchmarks/tests/test_replay.py), on the central KV cache's count where the optimistic end would hold 16."""
    spec = load_study(ROOT / "studies" / "qwen3.5-27b-rtx3090.toml")
    card, roomy, at16 = PROFILES["rtx3090"], {"max_num_seqs": 64}, Prior(incumbent=16, screen=True)
    thirteen = _estimate(weights_bytes=WEIGHTS, max_running_seqs=16, running_seqs=13)
    text = screen_before_boot(at16, roomy, thirteen, card, spec)
    assert text is not None and text.startswith("it runs 13 of the incumbent's 16 concurrent requests at once")
    assert screen_before_boot(at16, roomy, replace(thirteen, running_seqs=14), card, spec) is None
    assert screen_before_boot(Prior(incumbent=16, screen=False), roomy, thirteen, card, spec) is None  # a baseline
    # a KV cache the estimator does not model: max_num_seqs alone
    unknown = replace(thirteen, not_modelled=("kv_cache_dtype fp8_e5m2",))
    assert screen_before_boot(at16, roomy, unknown, card, spec) is None
    assert screen_before_boot(at16, {"max_num_seqs": 13}, unknown, card, spec) is not None
    # without a TTFT limit a queue misses nothing
    assert holds_too_few(16, 13, Limits(p95_tpot_ms=100.0)) is None
    assert holds_too_few(16, 13, CHAT.limits) is not None and holds_too_few(16, None, CHAT.limits) is None
    # on a machine whose one measurement spreads by ±20% (measured on enough repeats), 13 of 16 is within its noise
    assert holds_too_few(16, 13, CHAT.limits, noise=0.2) is None and holds_too_few(16, 12, CHAT.limits, 0.2)
    assert screen_before_boot(replace(at16, noise=0.2), roomy, thirteen, card, spec) is None


def _estimate(**fields: object) -> Estimate:
    """An Estimate with every other field empty: the screen reads the weights, the pool and what is not modelled."""
    empty = {f.name: 0 if f.type in ("int", "float") else False if f.type == "bool" else ()
             for f in dataclasses.fields(Estimate) if f.default is dataclasses.MISSING}
    return Estimate(**{**empty, **fields})  # type: ignore[arg-type]


def test_a_configuration_screened_before_boot_is_pruned_with_nothing_delivered() -> None:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    tell.tell_screened_before_boot(study, study.ask(), "max_num_seqs 1 holds 1 of 36")
    t = study.trials[0]
    assert t.state is TrialState.PRUNED and t.intermediate_values == {0: 0.0}
    assert t.user_attrs["booted"] is False and t.user_attrs["status"] == "stopped"
    assert t.user_attrs["reason"] == "screened out before boot: max_num_seqs 1 holds 1 of 36"
    assert t.constraints == {"memory": 0.0, "latency": 0.0, "boots": 0.0}
    assert record.why_not(t) == "screened out before boot"
