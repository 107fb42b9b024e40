"""GPU memory is the GPU's: with CUDA vLLM the sampler reads NVML whatever the slot, and every peak shown (status,
report, export's filter) names what it measured. NVML itself is not here (no GPU): the choice of source is a pure
function, and the labels are checked on trials recorded through the real outcome code, one with the peak that the
MemorySampler measured on the H200 (tests/data/gpu/eager-trial-result.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import _study_copy
from test_winner import _ok

from autotune.cli import main
from autotune.config.study_file import load_study
from autotune.errors import EngineError
from autotune.fit.hardware import GpuInfo
from autotune.measure.memory import MemoryPeak, memory_watch
from autotune.measure.trial import TrialResult
from autotune.search import record, tell
from autotune.search.record import trial_baseline
from autotune.search.space import engine_config, suggest
from autotune.search.study import open_study
from autotune.show import page as report_page
from autotune.show import report

DATA = Path(__file__).parents[2] / "data" / "gpu"


def h200(index: int) -> GpuInfo:
    info = json.loads((DATA / "h200-idle.json").read_text())["nvml"][0]
    return GpuInfo(**{**info, "index": index, "uuid": f"{info['uuid'][:-1]}{index}",
                      "compute_capability": tuple(info["compute_capability"])})


GPUS = [h200(0), h200(1), h200(2)]


def test_with_cuda_vllm_the_sampler_reads_the_gpu_whatever_the_slot():
    # The README's own form, `autotune run STUDY --budget ...` without --gpus: the slot names no GPU.
    assert memory_watch(True, (), None, GPUS) == ("nvml", (0, 1, 2))
    assert memory_watch(True, (2,), None, GPUS) == ("nvml", (2,))  # --gpus 2: the slot's GPU
    assert memory_watch(True, (), "1", GPUS) == ("nvml", (1,))  # the environment's CUDA_VISIBLE_DEVICES
    assert memory_watch(True, (), "2, 0", GPUS) == ("nvml", (2, 0))
    assert memory_watch(True, (), GPUS[1].uuid, GPUS) == ("nvml", (1,))  # named by UUID
    assert memory_watch(False, (), None, []) == ("rss", ())  # the CPU build: the server's host memory
    with pytest.raises(EngineError, match="NVML sees no GPU"):
        memory_watch(True, (), None, [])
    with pytest.raises(EngineError, match="CUDA_VISIBLE_DEVICES"):
        memory_watch(True, (), "7", GPUS)


def _study(tmp_path: Path, peaks: list[MemoryPeak]):
    spec = load_study(_study_copy(tmp_path))
    url = f"sqlite:///{tmp_path / 'tiny-cpu.db'}"
    study = open_study(spec, url)
    for i, peak in enumerate(peaks):
        trial = study.ask()
        config = engine_config(spec, suggest(trial, spec.space), baseline=trial_baseline(trial))
        for key, value in record.config_attrs(config.model, config.flags).items():
            trial.set_user_attr(key, value)
        result: TrialResult = _ok(200 - 10 * i, 300)
        tell.tell_result(study, trial, TrialResult(**{**result.__dict__, "memory": peak}))
    return url, study


def h200_peak() -> MemoryPeak:
    return MemoryPeak(**json.loads((DATA / "eager-trial-result.json").read_text())["memory"])


def test_every_peak_shown_names_its_source(tmp_path: Path):
    rss = MemoryPeak(int(3.4 * 2**30), "rss", 0, 50)
    url, study = _study(tmp_path / "mixed", [rss, h200_peak()])
    runner = CliRunner()

    status = runner.invoke(main, ["status", "--study", "tiny-cpu", "--storage", url])
    assert status.exit_code == 0, status.output
    assert "3.40 GiB host RSS" in status.output and "23.23 GiB GPU (NVML)" in status.output

    axis = report.memory_figure(study).layout.xaxis.title.text
    assert "GPU memory (NVML) for 1 trial(s)" in axis and "host memory (RSS" in axis and "not comparable" in axis
    page = report_page.write_report(study, tmp_path / "r", png=False).html.read_text()
    assert "23.23 GiB GPU (NVML)" in page and "3.40 GiB host RSS" in page  # the table of top trials

    # --max-vram filters on GPU memory only: trial 0's 3.4 GiB is host memory, whatever its size.
    exported = runner.invoke(main, ["export", "--study", "tiny-cpu", "--storage", url, "--format", "json",
                                    "--max-vram", "24"])
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["metrics"]["trial"] == 1


def test_max_vram_refuses_a_study_that_measured_host_memory(tmp_path: Path):
    url, study = _study(tmp_path / "cpu", [MemoryPeak(int(3.4 * 2**30), "rss", 0, 50)])
    assert report.memory_figure(study).layout.xaxis.title.text == \
        "peak host memory (RSS of the server's processes), GiB"
    out = CliRunner().invoke(main, ["export", "--study", "tiny-cpu", "--storage", url, "--max-vram", "24"])
    assert out.exit_code == 2
    assert out.output.strip().count("\n") == 0 and "--max-vram" in out.output and "host memory" in out.output
