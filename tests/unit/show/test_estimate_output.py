"""`autotune estimate --format json`: one JSON document carrying the predicted range, the verdict and whether the
estimate is calibrated."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from autotune.cli import main

STUDY = Path(__file__).parents[3] / "studies" / "qwen3.5-27b-rtx3090.toml"


def test_estimate_json_parses_and_carries_the_range(tmp_path) -> None:
    result = CliRunner().invoke(main, ["estimate", str(STUDY), "-n", "0", "--format", "json",
                                       "--storage", f"sqlite:///{tmp_path / 'none.db'}"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["hardware"] == "rtx3090"
    recipe = next(c for c in doc["configurations"] if c["configuration"] == "baseline: recipe")
    assert recipe["boot"] is True and recipe["refused"] is False  # the seed's recipe is no longer refused
    assert recipe["kv_tokens_low"] <= recipe["kv_tokens"] <= recipe["kv_tokens_high"]
    assert recipe["uncertainty_bytes"] > 0 and recipe["calibrated_by"] == 0
    # the boot's peak outside the budget (the installed vLLM's CUDA-graph profiling, 96 blocks at most) is below
    # the card, and above the weights
    assert recipe["weights_bytes"] < recipe["boot_peak_bytes"] < 23.7 * 2**30
    assert recipe["calibration"].startswith("uncalibrated")
    assert not (tmp_path / "none.db").exists()  # estimating never creates a storage
