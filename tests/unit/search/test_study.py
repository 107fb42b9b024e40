"""The study without the engine: real SQLite files, real Optuna, results built from real dataclasses."""

from __future__ import annotations

import json
import shlex
import sqlite3
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config.study_file import load_study
from autotune.engine.flags import serve_program
from autotune.engine.logs import BootInfo, Failure, FailureKind
from autotune.engine.server import EngineSpec, server_env
from autotune.errors import EngineError
from autotune.measure.client import LoadLevel
from autotune.measure.ladder import Prior
from autotune.measure.stats import LevelStats, Limits, Percentiles, Verdict
from autotune.measure.trial import SCREENED, LevelOutcome, TrialResult
from autotune.search import record, tell
from autotune.search.budget import Budget
from autotune.search.record import REMEASURE_ATTR, feasible, trial_baseline
from autotune.search.remeasure import best_trial
from autotune.search.remeasure import spread as remeasure_spread
from autotune.search.screen import load_prior
from autotune.search.space import suggest
from autotune.search.study import open_study

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture()
def spec(tmp_path: Path):
    study_file = tmp_path / "tiny-cpu.toml"
    text = (ROOT / "studies" / "tiny-cpu.toml").read_text().replace("../objectives/", f"{ROOT}/objectives/")
    study_file.write_text(text)
    return load_study(study_file)


def stats(conc: float, tok_s: float, ttft_p95: float) -> LevelStats:
    p = Percentiles(ttft_p95 / 2, ttft_p95 / 2, ttft_p95, ttft_p95, ttft_p95)
    return LevelStats(LoadLevel("concurrency", conc), 24, 0, 10.0, tok_s, tok_s * 5, 2.0, 2.0, p, p, p, p)


def level(conc: float, tok_s: float, passed: bool) -> tuple[float, LevelOutcome]:
    verdict = Verdict(passed, {} if passed else {"p95_ttft_ms": 1.5}, Limits(p95_ttft_ms=250))
    return conc, LevelOutcome(stats(conc, tok_s, 100 if passed else 375), verdict)


def ok_result(tok_s: float, peak_gib: float = 3.0) -> TrialResult:
    from autotune.measure.memory import MemoryPeak

    return TrialResult("ok", tok_s, 2, (level(1, tok_s / 2, True), level(2, tok_s, True), level(4, tok_s, False)),
                       boot=BootInfo(30.0, 524_288), memory=MemoryPeak(int(peak_gib * 2**30), "rss", 0, 10),
                       duration_s=60.0)


def told(study: optuna.Study, result: TrialResult, flags: dict | None = None, env: dict | None = None) -> TrialState:
    trial = study.ask()
    for k, v in record.config_attrs("/models/tiny", flags or {"max_num_seqs": 4}, env).items():
        trial.set_user_attr(k, v)
    return tell.tell_result(study, trial, result)


def test_open_study_enqueues_baselines_once_and_resumes(spec) -> None:
    study = open_study(spec)
    assert Path(spec.path.parent / "tiny-cpu.db").is_file()
    waiting = [t for t in study.trials if t.state == TrialState.WAITING]
    assert [t.user_attrs["baseline"]["name"] for t in waiting] == ["vllm-defaults", "recipe"]
    told(study, ok_result(400.0))
    again = open_study(spec)  # a second `autotune run`: same study, nothing enqueued twice, nothing lost
    assert len(again.trials) == 2
    assert [t.state for t in again.trials].count(TrialState.COMPLETE) == 1
    assert again.user_attrs["objective"] == "tiny-cpu"


def test_a_stale_baseline_outside_the_space_is_retried_as_it_was(spec) -> None:
    """vllm-defaults runs max_num_seqs=128, outside the space's 1-64 (allowed by design). Its worker died
    (kill -9 during the boot): the next run must queue it again as it was, not raise ValueError."""
    study = open_study(spec)
    trial = study.ask()
    params = suggest(trial, spec.space)
    assert trial_baseline(trial) == {} and params["max_num_seqs"] == 128
    study._storage.record_heartbeat(trial._trial_id)
    with sqlite3.connect(spec.path.parent / "tiny-cpu.db") as db:  # the worker's last beat, an hour ago
        db.execute("UPDATE trial_heartbeats SET heartbeat = datetime('now', '-1 hour')")
    resumed = open_study(spec)  # the next `autotune run`
    assert resumed.trials[0].state == TrialState.FAIL
    retries = [t for t in resumed.trials if t.system_attrs.get("failed_trial") == 0]
    assert [t.state for t in retries] == [TrialState.WAITING]
    assert [t.user_attrs["baseline"]["name"] for t in resumed.trials if t.state == TrialState.WAITING] == [
        "recipe", "vllm-defaults"]  # the retry stands for the baseline: it is not queued a second time
    resumed.ask()  # recipe
    again = resumed.ask()
    assert again.number == retries[0].number and trial_baseline(again) == {}
    assert suggest(again, spec.space) == params


def test_a_baseline_that_failed_through_no_fault_of_its_own_is_measured_when_the_study_resumes(spec) -> None:
    study = open_study(spec)
    interrupted = study.ask()
    tell.tell_interrupted(study, interrupted)
    study = open_study(spec)  # resumed: vllm-defaults has no measurement, so it is queued once more
    waiting = [t.user_attrs["baseline"]["name"] for t in study.trials if t.state == TrialState.WAITING]
    assert waiting == ["recipe", "vllm-defaults"]
    assert told(study, ok_result(500.0)) == TrialState.COMPLETE  # recipe
    killed = study.ask()
    assert killed.user_attrs["baseline"]["name"] == "vllm-defaults"
    # failed a second time, through no fault of its own
    tell.tell_engine_error(study, killed, EngineError("the tuner was killed"))
    study = open_study(spec)
    waiting = [t.user_attrs["baseline"]["name"] for t in study.trials if t.state == TrialState.WAITING]
    assert waiting == ["vllm-defaults"]
    assert told(study, ok_result(400.0)) == TrialState.COMPLETE
    study = open_study(spec)  # measured now: nothing queued again
    assert not [t for t in study.trials if t.state == TrialState.WAITING]


def test_a_searched_trial_that_ended_without_a_measurement_is_retried_once_as_it_was(spec) -> None:
    """Ctrl-C during a sampled trial: the next `autotune run` measures that configuration first (as it does one whose
    tuner was killed), says so, and retries it once only."""
    study = open_study(spec)
    for _ in spec.baselines:  # measured: only the sampled trial is left to retry
        told(study, ok_result(400.0))
    trial = study.ask()
    params = suggest(trial, spec.space)
    tell.tell_interrupted(study, trial)
    said: list[str] = []
    study = open_study(spec, say=said.append)
    waiting = [t for t in study.trials if t.state == TrialState.WAITING]
    assert [t.system_attrs["failed_trial"] for t in waiting] == [trial.number]
    assert said == [f"1 trial(s) that ended without a measurement queued again, as they were: #{trial.number}"]
    assert "reason" not in waiting[0].user_attrs  # how the first one ended is not carried over
    assert len(open_study(spec).trials) == len(study.trials)  # resumed again: not queued twice
    retry = study.ask()
    assert retry.number == waiting[0].number and suggest(retry, spec.space) == params
    tell.tell_interrupted(study, retry)  # interrupted again: once is enough
    resumed = open_study(spec)
    assert not [t for t in resumed.trials if t.state == TrialState.WAITING]


def test_outcomes_the_sampler_can_learn_from(spec) -> None:
    study = open_study(spec)
    assert told(study, ok_result(400.0)) == TrialState.COMPLETE
    oom = TrialResult("infeasible", failure=Failure(FailureKind.KV_CACHE_TOO_SMALL, "KV cache too small"))
    assert told(study, oom) == TrialState.COMPLETE
    slow = TrialResult("infeasible", levels=(level(1, 100, False),), boot=BootInfo(30.0), miss_ratio=1.5)
    assert told(study, slow) == TrialState.COMPLETE
    crash = TrialResult("failed", failure=Failure(FailureKind.INVALID_CONFIG, "bad flag"))
    assert told(study, crash) == TrialState.COMPLETE
    held = TrialResult("failed", failure=Failure(FailureKind.MEMORY_HELD, "another process holds the GPU"))
    assert told(study, held) == TrialState.FAIL  # says nothing about the configuration
    killed = TrialResult("failed", failure=Failure(FailureKind.KILLED, "the server was killed by SIGKILL"))
    assert told(study, killed) == TrialState.FAIL  # neither does an outside kill -9 of the server

    trials = study.get_trials(states=(TrialState.COMPLETE,))
    constraints = [t.constraints for t in trials]
    assert constraints[0] == {"memory": 0.0, "latency": 0.0, "boots": 0.0}
    assert constraints[1]["memory"] == 1.0
    assert constraints[2]["latency"] == pytest.approx(0.5)
    assert constraints[3]["boots"] == 1.0
    assert [feasible(t) for t in trials] == [True, False, False, False]
    first = trials[0].user_attrs
    assert first["output_throughput"] == 400.0 and first["kv_cache_tokens"] == 524_288 and first["best_level"] == 2
    assert first["peak_memory_gib"] == 3.0 and len(first["levels"]) == 3
    assert trials[1].user_attrs["failure_kind"] == "kv_cache_too_small"


def test_an_energy_objective_tells_tokens_per_joule_and_the_views_keep_the_throughput(spec) -> None:
    study = open_study(spec)
    efficient = ok_result(400.0)
    efficient = TrialResult(**{**efficient.__dict__, "maximized": 2.5})  # output tokens per joule at its best level
    told(study, ok_result(900.0))
    told(study, efficient)
    plain, energy = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert (plain.value, energy.value) == (900.0, 2.5)
    assert "output_tokens_per_joule" not in plain.user_attrs and energy.user_attrs["output_tokens_per_joule"] == 2.5
    assert [record.view(t).throughput for t in (plain, energy)] == [900.0, 400.0]
    assert [record.figure_text(t.value, t) for t in (plain, energy)] == ["900 output tok/s", "2.5 output tokens/J"]
    # NVML gave no energy: the machine's doing, not a verdict on the configuration (not COMPLETE, no constraint)
    unmeasured = Failure(FailureKind.NOT_MEASURED, "output_tokens_per_joule: no energy figure (NVML gave no samples)")
    assert told(study, TrialResult("failed", failure=unmeasured)) == TrialState.FAIL


def test_best_trial_ignores_infeasible_and_applies_filters(spec) -> None:
    study = open_study(spec)
    told(study, ok_result(400.0, peak_gib=3.0))
    told(study, ok_result(900.0, peak_gib=6.0))
    bigger_but_infeasible = TrialResult("infeasible", 2000.0, levels=(level(1, 2000, False),), miss_ratio=1.2)
    told(study, bigger_but_infeasible)
    assert best_trial(study).figure == 900.0
    assert best_trial(study, lambda t: t.user_attrs["peak_memory_gib"] <= 4).figure == 400.0


def test_rejected_before_boot_costs_nothing_and_counts_as_infeasible(spec) -> None:
    study = open_study(spec)
    trial = study.ask()
    tell.tell_rejected(study, trial, "does not fit: needs 30 GiB", memory_excess=6.5)
    t = study.trials[trial.number]
    assert t.state == TrialState.COMPLETE and t.constraints["memory"] == 6.5 and not feasible(t)
    assert t.user_attrs["booted"] is False


def test_export_flags_parse_back_with_vllms_own_parser(spec, monkeypatch) -> None:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    study = open_study(spec)
    flags = {"max_num_seqs": 12, "max_num_batched_tokens": 1536, "enable_prefix_caching": False,
             "enforce_eager": True, "load_format": "dummy"}
    told(study, ok_result(700.0), flags)
    monkeypatch.chdir(spec.path.parent)
    out = CliRunner().invoke(main, ["export", "--study", str(spec.path), "--format", "flags"])
    assert out.exit_code == 0, out.output
    words = shlex.split(out.stdout)
    program = list(serve_program())  # what serves where autotune runs: `vllm serve`, or the CPU build's module
    assert words[:len(program) + 1] == [*program, "/models/tiny"]
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(words[len(program) - 1 if program[-1] == "--model"
                                                                      else len(program):])
    for dest, value in flags.items():
        assert getattr(ns, dest) == value, dest
    as_json = CliRunner().invoke(main, ["export", "--study", str(spec.path), "--format", "json"])
    assert json.loads(as_json.stdout)["flags"] == flags


def test_export_carries_the_environment_the_trial_booted_with(spec, monkeypatch) -> None:
    """In every format, and from the trial's record: the study file's [engine.env] (VLLM_CPU_KVCACHE_SPACE)
    may have been edited since, so what this trial booted with (recorded by config_attrs) is what counts."""
    assert spec.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    study = open_study(spec)
    booted_with = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    told(study, ok_result(700.0), {"max_num_seqs": 12}, booted_with)
    monkeypatch.chdir(spec.path.parent)

    def export(fmt: str) -> str:
        out = CliRunner().invoke(main, ["export", "--study", str(spec.path), "--format", fmt])
        assert out.exit_code == 0, out.output
        return out.stdout  # the winner's figure goes to stderr: stdout is what a user pastes or captures

    assert shlex.split(export("flags"))[:4] == ["VLLM_CPU_KVCACHE_SPACE=2", "VLLM_USE_FLASHINFER_SAMPLER=0",
                                                *serve_program()[:2]]
    assert json.loads(export("json"))["env"] == booted_with
    header = [line for line in export("yaml").splitlines() if line.startswith("#")]
    assert "# VLLM_CPU_KVCACHE_SPACE=2" in header and "# VLLM_USE_FLASHINFER_SAMPLER=0" in header


def test_export_without_a_feasible_trial_is_a_clear_error(spec) -> None:
    study = open_study(spec)
    told(study, TrialResult("infeasible", failure=Failure(FailureKind.OUT_OF_MEMORY, "oom")))
    out = CliRunner().invoke(main, ["export", "--study", str(spec.path)])
    assert out.exit_code == 1
    assert "no feasible trial" in out.output


def test_budget_arithmetic_with_a_fake_clock() -> None:
    now = [1000.0]
    budget = Budget(seconds=600, clock=lambda: now[0])
    assert budget.next_trial_fits() == (True, "")  # nothing seen yet: the first trial always starts
    budget.record(200.0)
    budget.record(400.0)
    assert budget.expected_trial_s() == 300.0
    now[0] += 250  # 350 s left, a trial takes about 300 s
    assert budget.next_trial_fits()[0] is True
    now[0] += 100  # 250 s left
    fits, why = budget.next_trial_fits()
    assert not fits and "250 s left" in why
    now[0] += 1000
    assert budget.remaining() == 0.0 and budget.next_trial_fits() == (False, "time budget spent")
    counted = Budget(trials=2, clock=lambda: 0.0)
    counted.started_trials = 2
    assert counted.next_trial_fits() == (False, "2 trial(s) done")


def test_the_next_trial_is_expected_to_cost_what_the_searchs_own_trials_cost() -> None:
    """The device's chat study (benchmarks/data/h200-as-rtx3090-chat-kv-blocks-given): two baselines searched in full
    (379 s, 256 s), two sampled configurations screened out (159 s, 157 s), a re-measurement (265 s); it stopped with
    200 s left, "less than one trial (~256 s)", where a sampled trial took 158 s."""
    now = [0.0]
    budget = Budget(seconds=1450, clock=lambda: now[0])
    for length, searched in ((379, False), (256, False), (159, True), (157, True)):
        budget.record(length, searched=searched)
    budget.record(265, searched=False)
    assert budget.expected_trial_s() == 158.0
    now[0] = 1250  # 200 s left
    assert budget.next_trial_fits() == (True, "")
    only_baselines = Budget(seconds=1450, clock=lambda: 0.0)
    only_baselines.record(379, searched=False)
    only_baselines.record(256, searched=False)
    assert only_baselines.expected_trial_s() == 317.5  # nothing sampled yet: every trial says what one costs


def test_run_rejects_a_bad_budget_with_one_line_and_exit_2(spec) -> None:
    out = CliRunner().invoke(main, ["run", str(spec.path), "--budget", "4x"])
    assert out.exit_code == 2
    assert "--budget" in out.output and len(out.output.strip().splitlines()) == 1
    assert not (spec.path.parent / "tiny-cpu.db").exists()  # nothing written to the study


@pytest.mark.parametrize(("args", "fragment"), [
    (["--gpus", "0,0"], "--gpus: 0,0: expected distinct GPU indices"),
    (["--gpus", "a,1"], "--gpus: a,1: expected GPU indices"),
    (["--gpus", ","], "expected distinct GPU indices"),
    (["--gpus", "0,1", "--workers", "2"], "--workers: give --workers (CPU build) or --gpus"),
    (["--workers", "0"], "--workers: must be at least 1"),
])
def test_run_rejects_bad_slot_options_with_one_line_and_exit_2(spec, args, fragment) -> None:
    out = CliRunner().invoke(main, ["run", str(spec.path), "--n-trials", "1", *args])
    assert out.exit_code == 2, out.output
    assert fragment in out.output and len(out.output.strip().splitlines()) == 1
    assert not (spec.path.parent / "tiny-cpu.db").exists()


def test_gpus_give_one_slot_per_gpu_each_server_confined_to_its_own() -> None:
    from autotune.search.slots import slots_for as _slots

    slots = _slots(None, "2,0")
    assert [(s.name, s.gpu_indices, s.cuda_visible_devices) for s in slots] == [("2", (2,), "2"), ("0", (0,), "0")]
    assert [s.cuda_visible_devices for s in _slots(3, None)] == [None, None, None]  # CPU build: no CUDA devices
    assert len(_slots(None, None)) == 1
    inherited = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "PATH": "/usr/bin"}
    env = server_env(EngineSpec("m", env={"X": "1"}, cuda_visible_devices=slots[0].cuda_visible_devices), inherited)
    # the slot's own GPU, in NVML's (PCI bus) numbering, which is what the memory sampler reads
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"], env["X"], env["PATH"]) == ("2", "PCI_BUS_ID", "1",
                                                                                              "/usr/bin")
    assert server_env(EngineSpec("m"), inherited)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # no slot GPU: as inherited


def test_a_screened_out_trial_is_pruned_without_a_figure_and_never_the_winner(spec) -> None:
    study = open_study(spec)
    told(study, ok_result(400.0))
    screened = TrialResult("stopped", levels=(level(2, 900, False),), stop_reason=SCREENED, boot=BootInfo(30.0))
    assert told(study, screened) == TrialState.PRUNED
    t = study.trials[-1]
    # Not infeasible (TPE ranks it above every trial with a violated constraint), not a winner, no figure of its own
    # (Optuna keeps a PRUNED trial's last intermediate value as its value: no output shows it as one).
    assert t.constraints == {"memory": 0.0, "latency": 0.0, "boots": 0.0} and record.view(t).objective_value is None
    assert best_trial(study).figure == 400.0
    assert record.view(t).kind == "pruned" and t.user_attrs["reason"] == SCREENED


def test_no_pruner_stops_a_trial_between_levels_whatever_it_reports(spec) -> None:
    """Screening at the incumbent's level replaced the pruner: a trial that passed that level is searched in full,
    even where its figures after as many levels are far below other trials' (their levels differ)."""
    study = open_study(spec)
    for value in (1000.0, 1200.0, 900.0, 1100.0, 1000.0, 1300.0):
        t = study.ask()
        for step in range(4):
            t.report(value, step)
        tell.set_constraints(t)
        study.tell(t, value)
    low = study.ask()
    for step in range(4):
        low.report(1.0, step)
        assert not low.should_prune()


def test_screened_trials_are_ranked_for_tpe_by_the_throughput_that_met_the_limits(spec) -> None:
    """All screened trials fail the same level: TPE ranks PRUNED trials by their last intermediate value, so each
    reports the output throughput of its requests that met every limit there (goodput), a near miss above a far
    one."""
    from dataclasses import replace

    study = open_study(spec)
    told(study, ok_result(400.0))
    for good_share in (0.9, 0.3):  # of 2.0 requests/s ended in the window, these met every limit
        conc, outcome = level(2, 800, False)
        outcome = replace(outcome, stats=replace(outcome.stats, request_goodput=2.0 * good_share))
        told(study, TrialResult("stopped", levels=((conc, outcome),), stop_reason=SCREENED, boot=BootInfo(30.0)))
    near, far = study.trials[-2:]
    assert near.intermediate_values == {0: pytest.approx(720.0)}
    assert far.intermediate_values == {0: pytest.approx(240.0)}
    assert record.view(near).objective_value is None and best_trial(study).figure == 400.0  # no figure is claimed


def test_a_sampled_configuration_is_screened_at_the_incumbents_level_and_a_baseline_is_not(spec) -> None:
    study = open_study(spec)
    told(study, ok_result(400.0))  # the first baseline: best level 2
    baseline = study.ask()
    assert trial_baseline(baseline) is not None
    prior = load_prior(study, baseline, {"max_num_seqs": 16}, spec, kv_tokens=320 * 4)
    assert prior == Prior(incumbent=2, similar=(2.0,), cap=4.0, screen=False)
    study.tell(baseline, state=TrialState.FAIL)
    sampled = study.ask()
    suggest(sampled, spec.space)
    prior = load_prior(study, sampled, {"max_num_seqs": 64}, spec, kv_tokens=None)
    assert prior.screen and prior.incumbent == 2 and prior.cap == 64 and not prior.exact_first


def test_the_screen_before_boot_allows_for_the_noise_measured_on_enough_repeats(spec) -> None:
    study = open_study(spec)
    told(study, ok_result(400.0))  # the first baseline
    study.tell(study.ask(), state=TrialState.FAIL)  # the second baseline
    for k, tok_s in enumerate((320.0, 480.0, 360.0, 440.0)):  # the first baseline again, four times: ±17%
        study.enqueue_trial(study.trials[0].params, user_attrs={REMEASURE_ATTR: 0})
        told(study, ok_result(tok_s))
        sampled = study.ask()
        suggest(sampled, spec.space)
        prior = load_prior(study, sampled, {"max_num_seqs": 64}, spec, kv_tokens=None)
        steers = remeasure_spread(study.trials).steers
        assert steers == (k == 3) and prior.noise == (remeasure_spread(study.trials).sd if steers else 0.0)
        study.tell(sampled, state=TrialState.FAIL)
    assert prior.noise == pytest.approx(0.17, abs=0.01)


def test_a_remeasurement_starts_exactly_at_its_originals_best_level(spec) -> None:
    """Its first level is most often its answer, which is measured exactly: judged early first, it ran twice."""
    study = open_study(spec)
    told(study, ok_result(400.0))  # the first baseline: best level 2
    study.tell(study.ask(), state=TrialState.FAIL)  # the second baseline
    study.enqueue_trial(study.trials[0].params, user_attrs={REMEASURE_ATTR: 0})
    again = study.ask()
    prior = load_prior(study, again, {"max_num_seqs": 16}, spec, kv_tokens=320 * 4)
    assert prior == Prior(incumbent=2, similar=(), cap=4.0, screen=False, exact_first=True)


def test_a_baseline_refused_on_the_memory_estimate_is_judged_again_when_the_study_resumes(spec) -> None:
    """A baseline told "predicted not to fit" was refused under the corrections of that moment; calibration may have
    moved since, so the next `autotune run` queues it again. One refused for another reason (vLLM would
    refuse the flags) stays settled, and so does a baseline that was measured."""
    study = open_study(spec)
    refused = study.ask()
    assert trial_baseline(refused) == {} and refused.user_attrs["baseline"]["name"] == "vllm-defaults"
    tell.tell_rejected(study, refused, "predicted not to fit: weights 0.1 GiB + activations 9.0 GiB leave no KV cache",
                       memory_excess=2.0)
    other = study.ask()
    assert other.user_attrs["baseline"]["name"] == "recipe"
    tell.tell_rejected(study, other, "vLLM would refuse it: max_num_batched_tokens < max_model_len")
    resumed = open_study(spec)  # the next `autotune run`, on the same SQLite storage
    waiting = [t for t in resumed.trials if t.state == TrialState.WAITING]
    assert [t.user_attrs["baseline"]["name"] for t in waiting] == ["vllm-defaults"]
    assert [t.state for t in resumed.trials[:2]] == [TrialState.COMPLETE, TrialState.COMPLETE]  # history kept
    again = resumed.ask()
    assert again.number == waiting[0].number and again.user_attrs["baseline"]["flags"] == {
        **refused.user_attrs["baseline"]["flags"]}
    assert tell.tell_result(resumed, again, ok_result(450.0)) == TrialState.COMPLETE  # it booted this time
    assert not [t for t in open_study(spec).trials if t.state == TrialState.WAITING]  # measured: settled


def test_ctrl_c_while_slots_run_stops_them_and_raises_nothing_in_the_main_thread() -> None:
    """Real SIGINTs, 300 of them, sent to this process while the main thread waits for a slot: each sets the
    stop event and none raises, wherever in the main thread it lands (CI saw one escape between two waits as
    KeyboardInterrupt: exit 1 and the trial left RUNNING). The handler before is back afterwards.

    The last one sent may reach the main thread only after that handler is back (the kernel delivers a pending
    signal at a thread's next return from it: a fresh clone's `make test` saw KeyboardInterrupt inside
    signal.signal's restore), so the handler before is the test's own, which takes such a late one, and a sleep
    after the block lets it land there."""
    import os
    import signal
    import threading
    import time

    from autotune.search.threads import ctrl_c_stops, until_done

    stop, sent = threading.Event(), []

    def slot() -> None:  # a trial: runs until told to stop, then takes a moment to record itself
        for _ in range(300):
            os.kill(os.getpid(), signal.SIGINT)
            sent.append(1)
        stop.wait(10)

    def halt(why: str) -> None:
        reasons.add(why)
        stop.set()

    def before(signum: int, frame: object) -> None:
        """A SIGINT delivered after the block: nothing to do."""

    reasons: set[str] = set()
    outer = signal.signal(signal.SIGINT, before)
    try:
        with ctrl_c_stops(halt) as pressed:
            until_done([("slot", slot)])
        restored = signal.getsignal(signal.SIGINT)
        time.sleep(0.2)  # a system call: a signal still pending is delivered now, to `before`
    finally:
        signal.signal(signal.SIGINT, outer)
    assert len(sent) == 300 and pressed.is_set() and stop.is_set() and reasons == {tell.INTERRUPTED}
    assert restored is before


def test_without_ctrl_c_the_stop_event_is_untouched() -> None:
    import threading

    from autotune.search.threads import ctrl_c_stops, until_done

    stop, ran = threading.Event(), []
    with ctrl_c_stops(lambda why: stop.set()) as pressed:
        until_done([("a", lambda: ran.append("a")), ("b", lambda: ran.append("b"))])
    assert sorted(ran) == ["a", "b"] and not pressed.is_set() and not stop.is_set()


def test_the_first_reason_to_stop_is_what_the_trials_in_flight_are_recorded_with(tmp_path: Path) -> None:
    """A slot that fails stops the others: their trials are recorded with that failure, not as a user's Ctrl-C
    (a later Ctrl-C changes nothing), in the real SQLite study."""
    import threading

    from autotune.search.one_trial import StudyRun

    run = StudyRun(*([None] * 8), stop=threading.Event())  # type: ignore[arg-type]
    run.halt("stopped when slot gpu1 failed: GPU memory is held by another process")
    run.halt(tell.INTERRUPTED)
    assert run.stop.is_set() and run.why_stopped.startswith("stopped when slot gpu1 failed")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    trial = study.ask()
    tell.tell_interrupted(study, trial, run.why_stopped)
    got = study.trials[0]
    assert got.state == TrialState.FAIL and got.user_attrs["reason"] == run.why_stopped


def test_a_trial_added_to_a_shared_database_boots_nothing_the_study_file_does_not_set(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """Whoever can write a shared database can queue trials, and a worker boots what it asks (a baseline's flags
    travel in the trial): only flags and models the study file it was given sets are booted; the rest is told
    rejected, unbooted."""
    import shutil

    from autotune.search import one_trial
    from autotune.search.study import run_study

    shutil.copy(ROOT / "tests" / "data" / "quick" / "quick-objective.toml", tmp_path)
    study_file = tmp_path / "plain.toml"
    study_file.write_text("name = 'plain'\nobjective = 'quick-objective.toml'\nhardware = 'cpu'\n[model]\n"
                          "path = 'tiny:dense'\n[engine]\ndtype = 'float32'\n[engine.env]\n"
                          "VLLM_CPU_KVCACHE_SPACE = '1'\n[space.max_num_seqs]\ntype = 'int'\nlow = 2\nhigh = 8\n")
    spec = load_study(study_file)
    study = open_study(spec)
    study.enqueue_trial({}, user_attrs={"baseline": {"name": "added", "flags": {
        "compilation_config": {"cache_dir": str(tmp_path / "compiled-elsewhere")}}}})
    booted: list[dict[str, object]] = []

    def run_trial(plan, **kwargs) -> TrialResult:  # no server: what would boot is all this test needs
        booted.append(dict(plan.engine.flags))
        return TrialResult("failed", failure=Failure(FailureKind.INVALID_CONFIG, "not booted in this test"))

    monkeypatch.setattr(one_trial, "run_trial", run_trial)
    run_study(spec, Budget(trials=1))
    added = open_study(spec).trials[0]
    assert added.user_attrs["booted"] is False, added.user_attrs
    assert "not booted: compilation_config cannot be set from a study with 'cache_dir'" in added.user_attrs["reason"]
    assert booted and not [flags for flags in booted if "compilation_config" in flags]  # the next trial booted
