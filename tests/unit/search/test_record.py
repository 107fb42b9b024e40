"""What a booted trial records about its boot: the compile cache it found and a cold boot booted again warm."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from optuna.trial import TrialState
from rich.console import Console

from autotune.config.objective import load_objective
from autotune.engine.flags import serve_command, serve_program
from autotune.engine.logs import BootInfo, Failure, FailureKind, classify_log
from autotune.measure.memory import MemoryPeak
from autotune.measure.trial import ColdBoot, TrialResult
from autotune.search import record, tell
from autotune.search.record import result_attrs
from autotune.show import report
from autotune.show.tables import print_trial
from autotune.units import GiB

GPU_BOOTS = Path(__file__).parents[2] / "data" / "gpu-boots"


REPO = Path(__file__).parents[3]


def test_a_warm_boot_after_a_cold_memory_failure_records_both() -> None:
    cold = classify_log((GPU_BOOTS / "a-s48-b8192-l8192-cold.log").read_text().splitlines())
    result = TrialResult("infeasible", boot=BootInfo(84.0, 33_353), compile_cache="warm",
                         cold_boot=ColdBoot(cold, 275.4, Path("runs/trial-0003.cold.log")))
    attrs = result_attrs(result)
    assert attrs["compile_cache"] == "warm" and attrs["boot_s"] == 84.0
    assert attrs["cold_boot_s"] == 275.4 and "Mamba cache blocks (34)" in str(attrs["cold_boot_failure"])
    assert attrs["cold_boot_log_path"] == "runs/trial-0003.cold.log"


def test_an_eager_boot_records_no_compile_cache() -> None:
    attrs = result_attrs(TrialResult("infeasible", boot=BootInfo(30.0, 524_288)))
    assert "compile_cache" not in attrs and "cold_boot_s" not in attrs and attrs["boot_s"] == 30.0


def test_out_of_memory_under_load_is_told_as_a_memory_failure() -> None:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    trial = study.ask()
    oom = Failure(FailureKind.OUT_OF_MEMORY, "out of memory: torch.OutOfMemoryError: CUDA out of memory.")
    state = tell.tell_result(study, trial, TrialResult("infeasible", boot=BootInfo(70.0), failure=oom,
                                                       compile_cache="warm"))
    frozen = study.trials[0]
    assert state is TrialState.COMPLETE and frozen.constraints == {"memory": 1.0, "latency": 0.0, "boots": 0.0}
    assert frozen.user_attrs["failure_kind"] == "out_of_memory" and frozen.user_attrs["compile_cache"] == "warm"


def test_the_recorded_command_is_the_one_export_prints():
    """The run's summary prints the command recorded at boot; export builds it from the stored flags: the same
    text, whatever order the flags were booted in."""
    attrs = record.config_attrs("/models/tiny", {"load_format": "dummy", "enforce_eager": True, "max_num_seqs": 4},
                                {"VLLM_CPU_KVCACHE_SPACE": "1"})
    stored = json.loads(attrs["flags"])
    assert attrs["vllm_command"] == serve_command("/models/tiny", stored, json.loads(attrs["env"]), serve_program())
    assert attrs["vllm_command"].index("--enforce-eager") < attrs["vllm_command"].index("--load-format")


def test_the_trial_figure_is_the_serving_peak_and_a_higher_boot_peak_is_said() -> None:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    trial = study.ask()
    peak = MemoryPeak(int(23.05 * GiB), "nvml", 0, 500, boot_peak_bytes=int(31.36 * GiB))
    tell.tell_result(study, trial, TrialResult("infeasible", boot=BootInfo(104.5), memory=peak))
    frozen = study.trials[0]
    assert (frozen.user_attrs["peak_memory_gib"], frozen.user_attrs["boot_peak_memory_gib"]) == (23.05, 31.36)
    said = "peak 23.05 GiB GPU memory (NVML) while serving (31.36 GiB while booting)"
    assert said in record.trial_note(frozen)
    # the same words where `autotune trial` prints it, and in the report's hover text
    console = Console(record=True, width=200)
    print_trial(console, TrialResult("infeasible", boot=BootInfo(104.5), memory=peak),
                load_objective(REPO / "objectives" / "chat-p95.toml"))
    assert said in console.export_text()
    assert said in report._memory_text(record.view(frozen))
    never_ready = result_attrs(TrialResult("infeasible", memory=MemoryPeak(GiB, "nvml", 0, 5)))
    assert never_ready["peak_memory_gib"] == 1.0 and "boot_peak_memory_gib" not in never_ready


def test_a_serving_peak_over_the_capped_cards_cuda_memory_is_said_in_every_view() -> None:
    # The H200 capped as an RTX 3090 (benchmarks/data/h200-as-rtx3090-awq/surface.json #16 and #11): 24.257 GiB while
    # serving is above the 23.62 GiB CUDA has on a 24 GiB card (its driver keeps 384 MiB); 22.1 GiB is not.
    from autotune.fit import memcap
    from autotune.show.page import trials_table_html
    from autotune.show.tables import study_table

    cap_gib = memcap.parse_cap("rtx3090").cuda_total_gib
    assert cap_gib == 23.625
    said = "above the 23.62 GiB CUDA has on the capped card: it may not fit there"
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="maximize")
    for peak_gib in (24.257, 22.1):
        trial = study.ask()
        trial.set_user_attr(record.CAP_ATTR, cap_gib)
        memory = MemoryPeak(int(peak_gib * GiB), "nvml", 0, 500, boot_peak_bytes=int(47.368 * GiB))
        tell.tell_result(study, trial, TrialResult("infeasible", boot=BootInfo(143.7), memory=memory))
    over, under = study.trials
    assert said in record.trial_note(over) and said in report._memory_text(record.view(over))
    assert "above" not in record.trial_note(under) and "above" not in report._memory_text(record.view(under))
    console = Console(record=True, width=220)
    console.print(study_table(study.trials))
    table = console.export_text()
    assert "24.26 GiB GPU (NVML) > cap" in table and "22.10 GiB GPU (NVML) > cap" not in table
    assert trials_table_html(study).count("&gt; cap") == 1
    console = Console(record=True, width=220)
    print_trial(console, TrialResult("infeasible", boot=BootInfo(143.7), memory=MemoryPeak(
        int(24.257 * GiB), "nvml", 0, 500)), load_objective(REPO / "objectives" / "chat-p95.toml"), cap_gib)
    assert said in console.export_text()
    # without a cap nothing is said: a card's own peak is its own
    trial = study.ask()
    tell.tell_result(study, trial, TrialResult("infeasible", memory=MemoryPeak(int(30 * GiB), "nvml", 0, 5)))
    assert "above" not in record.trial_note(study.trials[-1])


def test_every_ending_has_one_word_in_every_output() -> None:
    """How each trial ended, told through the real tell functions: one word each, the same in the `status` table,
    the trial's note and the report's legend and summary."""
    from autotune.show import page

    study = optuna.create_study(direction="maximize")
    study.set_user_attr("limits", {"ttft_p95_ms": 500})

    def asked() -> optuna.Trial:
        trial = study.ask()
        trial.suggest_int("x", 0, 10)
        return trial

    levels = ()
    tell.tell_result(study, asked(), TrialResult("ok", 100.0, 1, levels, BootInfo(10.0), duration_s=30.0))
    tell.tell_result(study, asked(), TrialResult("infeasible", levels=levels, boot=BootInfo(10.0), miss_ratio=1.5))
    tell.tell_result(study, asked(), TrialResult("infeasible", failure=Failure(FailureKind.KV_CACHE_TOO_SMALL, "KV",
                                                                                "ValueError")))
    tell.tell_rejected(study, asked(), "vLLM would reject it: --max-num-seqs 0")
    tell.tell_screened_before_boot(study, asked(), "cannot sustain concurrency 16")
    tell.tell_result(study, asked(), TrialResult("stopped", levels=levels, boot=BootInfo(10.0),
                                                 stop_reason="stopped at the end of the time budget"))
    tell.tell_interrupted(study, asked())
    study.tell(asked(), state=TrialState.FAIL)  # what Optuna's stale-trial check leaves: never told by autotune
    tell.tell_gpu_busy(study, asked(), "GPU 0: 3.1 GiB in use")
    asked()  # still running
    expected = [record.MEASURED, record.MISSED_LIMITS, record.OUT_OF_MEMORY, record.REFUSED, record.SCREENED_OUT,
                record.BUDGET_END, record.INTERRUPTED, record.STALE, record.FAILED, record.RUNNING]
    assert [record.ending(t) for t in study.trials] == expected
    assert [v.ending for v in record.views(study)] == expected
    stale = "its worker stopped sending heartbeats (killed or lost); queued again once"
    assert record.view(study.trials[7]).reason == stale
    assert record.view(study.trials[6]).reason == tell.INTERRUPTED
    console = Console(width=250, record=True)
    from autotune.show.tables import study_table

    console.print(study_table(study.trials))
    rows = {int(line.split("│")[1]): line.split("│")[2].strip() for line in console.export_text().splitlines()
            if line.startswith("│") and line.split("│")[1].strip().isdigit()}
    assert [rows[n] for n in range(10)] == expected
    for n in range(1, 9):
        assert record.trial_note(study.trials[n]).startswith(f"**{expected[n].capitalize()}**")
    summary = page.summary_html(study)
    assert "1 measured, 1 missed the limits, 1 out of memory, 1 refused before boot, 1 screened out, 1 stopped by " \
           "the budget, 1 interrupted, 1 stale, 1 failed, 1 running" in summary
