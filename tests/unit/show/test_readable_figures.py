"""Figures for people: floats printed as a person would write them, in one helper (export.value_text), and the
importance chart drawn only from enough booted configurations, saying what it stands on."""

from __future__ import annotations

from pathlib import Path

import optuna
import yaml
from click.testing import CliRunner
from conftest import _study_copy
from test_winner import _ok

from autotune.cli import main
from autotune.config.study_file import load_study
from autotune.engine.flags import float_text, serve_command
from autotune.search import record, tell
from autotune.search.record import trial_baseline
from autotune.search.space import engine_config, suggest
from autotune.search.study import open_study
from autotune.show import report
from autotune.show.export import to_json, to_yaml

ROOT = Path(__file__).resolve().parents[3]
SUM = 0.85 + 7 * 0.01  # how a stepped float space lands on 0.92: 0.9199999999999999


def test_floats_are_printed_for_people_wherever_flags_are_printed():
    assert repr(SUM) == "0.9199999999999999" and float_text(SUM) == "0.92"
    assert float_text(0.15547130205719425) == "0.155471302"  # a memory cap's utilization: within 1e-9
    assert float_text(2.0) == "2.0" and float_text(1e-5) == "1e-05"
    flags = {"gpu_memory_utilization": SUM, "max_num_seqs": 8}
    assert serve_command("m", flags) == "vllm serve m --host 127.0.0.1 --gpu-memory-utilization 0.92 --max-num-seqs 8"
    assert yaml.safe_load(to_yaml(flags))["gpu-memory-utilization"] == 0.92
    assert "0.92" in to_yaml(flags) and "0.9199" not in to_yaml(flags)
    assert "0.9199" not in to_json("m", flags, {})


def test_estimate_prints_sampled_floats_rounded():
    out = CliRunner().invoke(main, ["estimate", str(ROOT / "studies" / "qwen3.5-27b-rtx3090.toml"), "-n", "10"])
    assert out.exit_code == 0, out.output
    assert "gpu_memory_utilization=0.92" in out.output  # the vllm-defaults baseline's default
    assert "99999" not in out.output and "00000000" not in out.output


def _study(tmp_path: Path, booted: int, rejected: int) -> optuna.Study:
    spec = load_study(_study_copy(tmp_path))
    study = open_study(spec, f"sqlite:///{tmp_path / 'tiny-cpu.db'}")
    for i in range(booted + rejected):
        trial = study.ask()
        config = engine_config(spec, suggest(trial, spec.space), baseline=trial_baseline(trial))
        for key, value in record.config_attrs(config.model, config.flags).items():
            trial.set_user_attr(key, value)
        if i < booted:
            tell.tell_result(study, trial, _ok(100 + 40 * i, 300))
        else:
            tell.tell_rejected(study, trial, "predicted not to fit", memory_excess=1.0 + i)
    return study


def test_importances_are_drawn_only_from_enough_booted_configurations(tmp_path: Path):
    # One booted configuration (the first baseline) and five refused before boot: nothing to say about parameters.
    one = _study(tmp_path / "one", booted=1, rejected=5)
    assert report.param_importances(one) == {}
    note = report.importance_figure(one).layout.annotations[0].text
    assert "at least 4 booted configurations" in note and "1 booted configuration(s) of 6 finished trials" in note

    five = _study(tmp_path / "five", booted=5, rejected=1)
    fig = report.importance_figure(five)
    assert report.param_importances(five) and fig.data
    assert "based on 6 finished trials, 5 booted configurations" in fig.layout.title.text
