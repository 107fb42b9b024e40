"""One option name per meaning across commands (--gpus: GPU indices; --hardware: a hardware profile); the old
spellings are still read, with a one-line notice."""

from __future__ import annotations

from click.testing import CliRunner

from autotune import notices
from autotune.cli import main


def test_estimate_takes_hardware_and_still_reads_gpu_with_a_notice(monkeypatch) -> None:
    monkeypatch.setattr(notices, "_said", set())
    runner = CliRunner()
    new = runner.invoke(main, ["estimate", "--model", "tiny:dense", "--hardware", "cpu", "--format", "json"])
    assert new.exit_code == 0, new.output
    old = runner.invoke(main, ["estimate", "--model", "tiny:dense", "--gpu", "cpu", "--format", "json"])
    assert old.exit_code == 0, old.output
    assert old.stdout == new.stdout  # the same profile, the same estimate
    assert "notice: --gpu is now --hardware" in old.stderr and "notice:" not in new.stderr
    both = runner.invoke(main, ["estimate", "--model", "tiny:dense", "--hardware", "cpu", "--gpu", "cpu"])
    assert both.exit_code == 2 and "--gpu: cpu: give --hardware only" in both.output
    assert "--hardware" in runner.invoke(main, ["estimate", "--help"]).stdout
    assert "--gpu " not in runner.invoke(main, ["estimate", "--help"]).stdout  # hidden


def test_trial_names_gpu_indices_gpus_as_run_and_worker_do() -> None:
    for command in ("trial", "run", "worker"):
        assert "--gpus" in CliRunner().invoke(main, [command, "--help"]).stdout
