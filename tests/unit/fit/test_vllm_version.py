"""The estimator per vLLM version (fit/vllm_version.py, fit/vllm_memory.py VERSION_TERMS): which version a
prediction models and how every output names it. On recorded boots: benchmarks/tests/test_estimator_per_version.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.fit.feasibility import judge
from autotune.fit.hardware import get_profile
from autotune.fit.vllm_version import MODELLED_VERSIONS, modelled_version

CONFIG = Path(__file__).resolve().parents[3] / "autotune" / "engine" / "known_models" / "qwen3.5-27b-awq.json"


@pytest.mark.parametrize(("asked", "modelled", "exact"), [
    ("0.25.0", "0.25.0", True),
    ("0.32.0", "0.32.0", True),
    ("0.32.0+cpu", "0.32.0", True),  # a local build of a modelled release is that release
    ("0.25.1", "0.25.0", False),
    ("0.27.1", "0.25.0", False),  # nearer 0.25 than 0.32 by release number
    ("0.29.1", "0.32.0", False),
    ("0.20.1rc1.dev16+g01d4d1ad3", "0.25.0", False),
    ("0.40.0", "0.32.0", False),
    (None, MODELLED_VERSIONS[-1], True),  # none given and none installed: the newest, as modelled
])
def test_a_version_is_predicted_with_the_nearest_modelled_one(asked, modelled, exact):
    version = modelled_version(asked)
    assert (version.modelled, version.exact) == (modelled, exact)
    assert version.label == (f"vLLM {modelled}" if exact else f"vLLM {asked} as {modelled}")
    assert bool(version.note) is not exact


def test_a_refusal_names_the_version_it_was_modelled_for(tmp_path: Path):
    model = tmp_path / "awq"
    model.mkdir()
    shutil.copy(CONFIG, model / "config.json")
    flags = {"max_model_len": 262144, "max_num_seqs": 4}  # a full-length request needs 16 GiB of bf16 KV
    for version in MODELLED_VERSIONS:
        v = judge(str(model), get_profile("rtx3090"), flags, {}, vllm_version=version)
        assert not v.fits and v.reason.endswith(f"(modelled for vLLM {version})")


def test_estimate_vllm_version_predicts_for_that_version_and_says_so(tmp_path: Path):
    model = tmp_path / "awq"
    model.mkdir()
    shutil.copy(CONFIG, model / "config.json")
    args = ["estimate", "--model", str(model), "--hardware", "rtx3090", "--set", "max_model_len=65536",
            "--set", "max_num_seqs=2", "--set", "kv_cache_dtype=fp8", "--format", "json"]
    runner = CliRunner()
    out = {}
    for version in ("0.25.0", "0.32.0", "0.29.1"):
        result = runner.invoke(main, [*args, "--vllm-version", version])
        assert result.exit_code == 0, result.output
        out[version] = json.loads(result.stdout)["configurations"][0]
    assert out["0.25.0"]["vllm_version"] == "vLLM 0.25.0" and out["0.25.0"]["version_note"] == ""
    assert out["0.32.0"]["vllm_version"] == "vLLM 0.32.0"
    assert "vLLM 0.25.0" in out["0.25.0"]["calibration"]
    assert out["0.29.1"]["vllm_version"] == "vLLM 0.29.1 as 0.32.0" and "not modelled" in out["0.29.1"]["version_note"]
    assert out["0.29.1"]["uncertainty_bytes"] > out["0.32.0"]["uncertainty_bytes"]
    table = runner.invoke(main, [*args[:-2], "--vllm-version", "0.29.1"])
    assert table.exit_code == 0 and "vLLM 0.29.1 as 0.32.0" in table.stdout
    assert "note: vLLM 0.29.1 is not modelled" in table.stderr


def test_a_study_names_the_version_its_gpu_machine_runs(tmp_path: Path):
    """`vllm_version` in a study file: `estimate STUDY` (and the run's judge before boot) predicts for it."""
    quick = Path(__file__).resolve().parents[2] / "data" / "quick"
    for f in quick.iterdir():
        shutil.copy(f, tmp_path / f.name)
    study = tmp_path / "quick.toml"
    study.write_text(study.read_text().replace('hardware = "cpu"', 'hardware = "cpu"\nvllm_version = "0.25.0"'))
    args = ["estimate", str(study), "-n", "1", "--format", "json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["configurations"]
    assert rows and {r["vllm_version"] for r in rows} == {"vLLM 0.25.0"}
    again = CliRunner().invoke(main, [*args, "--vllm-version", "0.32.0"])
    assert {r["vllm_version"] for r in json.loads(again.stdout)["configurations"]} == {"vLLM 0.32.0"}


def test_a_configuration_beyond_what_the_version_measured_is_widened_and_said(monkeypatch):
    """0.25.0's warm boots profiled 1,024-16,384 batched tokens with at most one drafted token: 32,768 tokens and
    MTP 3 are extrapolated there, so the band widens (one OUTSIDE_MEASURED_BYTES per term, in quadrature) and the
    estimate says what was not measured; within the range nothing changes."""
    import dataclasses
    import math

    from autotune.fit import vllm_memory
    from autotune.fit.estimate import estimate
    from autotune.fit.model_shape import ModelShape

    shape = ModelShape.from_config(json.loads(CONFIG.read_text()))
    flags = {"max_model_len": 65536, "max_num_seqs": 2, "max_num_batched_tokens": 32768,
             "speculative_config": {"method": "mtp", "num_speculative_tokens": 3}}
    card = get_profile("rtx3090")
    beyond = estimate(shape, card, flags, vllm_version="0.25.0")
    assert "max_num_batched_tokens 32,768 (measured 1,024-16,384)" in beyond.version_note
    assert "3 speculative tokens (measured up to 1)" in beyond.version_note
    wide = dataclasses.replace(vllm_memory.VERSION_TERMS["0.25.0"], batched_measured=(1024, 65536), spec_measured=4)
    monkeypatch.setitem(vllm_memory.VERSION_TERMS, "0.25.0", wide)
    within = estimate(shape, card, flags, vllm_version="0.25.0")
    assert within.version_note == "" and within.kv_tokens == beyond.kv_tokens
    expected = math.hypot(within.uncertainty_bytes, vllm_memory.OUTSIDE_MEASURED_BYTES,
                          vllm_memory.OUTSIDE_MEASURED_BYTES)
    assert abs(beyond.uncertainty_bytes - expected) <= 2


def test_the_vision_encoder_an_estimate_counts_is_said(tmp_path: Path):
    """The 0.9 GiB an estimate put below what text-only boots printed at 65k-131k: the Qwen3.5 checkpoint is a
    vision-language model, and without language_model_only its encoder's 0.86 GiB of weights is counted (vLLM loads
    it); the estimate says so, and told text-only it drops it (KV 3.24 -> 4.12 GiB here)."""
    from autotune.fit.estimate import estimate
    from autotune.fit.model_shape import ModelShape

    shape = ModelShape.from_config(json.loads(CONFIG.read_text()))
    flags = {"max_model_len": 65536, "max_num_seqs": 2, "max_num_batched_tokens": 2048}
    both = estimate(shape, get_profile("rtx3090"), flags, vllm_version="0.25.0")
    text = estimate(shape, get_profile("rtx3090"), {**flags, "language_model_only": True}, vllm_version="0.25.0")
    assert text.vision_bytes == 0 and 0.8 * 2**30 < both.vision_bytes < 0.9 * 2**30
    assert both.weights_bytes - text.weights_bytes == both.vision_bytes
    assert text.kv_cache_bytes - both.kv_cache_bytes > 0.85 * 2**30
    model = tmp_path / "awq"
    model.mkdir()
    shutil.copy(CONFIG, model / "config.json")
    out = CliRunner().invoke(main, ["estimate", "--model", str(model), "--hardware", "rtx3090", "--set",
                                    "max_model_len=65536", "--vllm-version", "0.25.0"])
    assert out.exit_code == 0 and "of which the vision encoder" in out.stdout and "language_model_only" in out.stdout
