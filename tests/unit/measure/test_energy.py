"""Energy per output token: the arithmetic on NVML samples recorded on an H100 and the verdict on an energy limit
(the real sampling path: test_energy_gpu.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.measure.client import LevelRun, LoadLevel, RequestRecord
from autotune.measure.energy import PowerSample, energy_between, joules_per_token
from autotune.measure.stats import Limits, judge, level_stats
from autotune.search.record import energy_text

# PowerSampler (autotune.measure.energy) on an H100 80GB HBM3 (driver 580.159.04), every 0.1 s: 74 W idle, then a
# child process running bf16 8192^3 matmuls from 2.0 s to 13.3 s (PyTorch's start took the first ~6 s: the draw
# rises at ~8.5 s, ~700 W, and falls at ~12.9 s), then 2 s idle. Times are seconds from the first sample; energy_j
# is the card's total-energy counter.
RECORDED = Path(__file__).resolve().parents[2] / "data" / "gpu" / "nvml-power-h100-matmul.jsonl"


def recorded() -> list[PowerSample]:
    rows = [json.loads(line) for line in RECORDED.read_text().splitlines()]
    return [PowerSample(r["t"], r["watts"], r["energy_j"]) for r in rows]


def test_the_counter_and_the_integrated_power_agree_on_a_recorded_load() -> None:
    samples = recorded()
    power_only = [PowerSample(s.t, s.watts, None) for s in samples]
    for t0, t1 in ((0.05, samples[-1].t - 0.05), (8.0, 13.5), (0.5, 1.5)):
        counter, integrated = energy_between(samples, t0, t1), energy_between(power_only, t0, t1)
        assert counter is not None and integrated is not None
        assert integrated == pytest.approx(counter, rel=0.05), (t0, t1)
    idle = energy_between(samples, 0.2, 1.2)
    busy = energy_between(samples, 10.0, 11.0)
    assert idle == pytest.approx(74, rel=0.05) and busy is not None and busy > 8 * idle  # joules in one second


def test_energy_is_interpolated_inside_a_sample_gap_and_none_outside_the_samples() -> None:
    samples = [PowerSample(0.0, 100.0, 1000.0), PowerSample(1.0, 300.0, 1200.0), PowerSample(2.0, 300.0, 1500.0)]
    assert energy_between(samples, 0.5, 1.5) == pytest.approx(1350.0 - 1100.0)
    power = [PowerSample(s.t, s.watts, None) for s in samples]
    # trapezoids: 0.5-1.0 s from 200 W to 300 W, then 1.0-1.5 s at 300 W
    assert energy_between(power, 0.5, 1.5) == pytest.approx(0.5 * 250 + 0.5 * 300)
    assert energy_between(samples, -0.1, 1.0) is None and energy_between(samples, 1.0, 2.1) is None
    assert energy_between(samples, 1.0, 1.0) is None and energy_between([], 0, 1) is None


def run_of(n: int, tokens: int, gap: float = 0.5) -> LevelRun:
    """`n` requests one after another, `tokens` each, `gap` s apart: a level whose steady window is its span."""
    recs = [RequestRecord(i * gap, 0.1, [0.05] * (tokens - 1), i * gap + 0.1 + 0.05 * (tokens - 1), 8, tokens, None)
            for i in range(n)]
    return LevelRun(LoadLevel("rate", 2.0), recs, 0.0, recs[-1].end)


def test_joules_per_token_is_the_windows_energy_over_its_output_tokens() -> None:
    run = run_of(8, 5)
    samples = [PowerSample(t / 10, 200.0, 50.0 + 20.0 * t / 10) for t in range(-5, 60)]  # 20 W of counter
    stats = level_stats(run, Limits(), samples)
    window = stats.window_s
    assert stats.joules_per_token == pytest.approx(20.0 * window / (stats.output_throughput * window))
    assert stats.to_dict()["joules_per_output_token"] == stats.joules_per_token
    unmeasured = level_stats(run, Limits())
    assert unmeasured.joules_per_token is None and "joules_per_output_token" not in unmeasured.to_dict()
    assert joules_per_token(samples, 0.0, 1.0, 0) is None


def test_an_energy_limit_is_judged_and_an_unmeasured_one_is_not_met() -> None:
    run = run_of(8, 5)
    samples = [PowerSample(t / 10, 200.0, 20.0 * t / 10) for t in range(-5, 60)]
    stats = level_stats(run, Limits(), samples)
    j = stats.joules_per_token
    assert j is not None
    assert judge(stats, Limits(joules_per_token=j * 1.1)).passed
    verdict = judge(stats, Limits(joules_per_token=j / 2))
    assert not verdict.passed and verdict.misses["joules_per_token"] == pytest.approx(2.0)
    assert "J per output token > limit" in verdict.reason
    cpu = judge(level_stats(run, Limits()), Limits(joules_per_token=1.0))
    assert not cpu.passed and cpu.reason == "energy per token not measured (NVML, on a CUDA GPU only)"
    assert energy_text(None) == "energy per token: not measured (NVML, on a CUDA GPU only)"


def test_energy_as_the_figure_maximised_is_tokens_per_joule_at_the_level() -> None:
    run = run_of(8, 5)
    samples = [PowerSample(t / 10, 200.0, 20.0 * t / 10) for t in range(-5, 60)]
    stats = level_stats(run, Limits(), samples)
    assert stats.joules_per_token is not None
    assert stats.figure("output_tokens_per_joule") == pytest.approx(1 / stats.joules_per_token)
    assert stats.figure("output_throughput") == stats.output_throughput
    assert level_stats(run, Limits()).figure("output_tokens_per_joule") is None  # no NVML: not measured


@pytest.mark.parametrize(("key", "edit"), [
    ("limits.joules_per_token", lambda text: text.replace("[limits]\n", "[limits]\njoules_per_token = 0.5\n")),
    ("maximize", lambda text: 'maximize = "output_tokens_per_joule"\n' + text),
])
def test_energy_is_refused_on_the_cpu_build_before_anything_is_written(tmp_path: Path, key: str, edit) -> None:
    quick = Path(__file__).resolve().parents[2] / "data" / "quick"
    for f in quick.iterdir():
        shutil.copy(f, tmp_path / f.name)
    objective = tmp_path / "quick-objective.toml"
    objective.write_text(edit(objective.read_text()))
    before = sorted(tmp_path.iterdir())
    out = CliRunner().invoke(main, ["run", str(tmp_path / "quick.toml"), "--n-trials", "1"])
    lines = [line for line in out.output.splitlines() if line.strip()]
    said = f"error: {objective}: {key}: energy is measured with NVML on a CUDA GPU; on the CPU build"
    assert out.exit_code == 2 and lines == [said + " it is not measured"], out.output
    assert sorted(tmp_path.iterdir()) == before
