"""The README's worked example: its `autotune estimate` output is what the command prints today, and its study
file loads and estimates."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from click.testing import CliRunner

from autotune.cli import main
from autotune.config.study_file import load_study

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
# Qwen3-8B-Base's published config.json: Qwen3-8B's shapes (tests/data/checkpoints/README.md), read offline.
QWEN3_8B = ROOT / "tests" / "data" / "checkpoints" / "qwen3-8b-base"


def rows(table: str) -> dict[str, str]:
    """A rich key/value table's rows: {'KV per token': '72.0 KiB', ...}."""
    cells = (re.findall(r"│\s*([^│]*?)\s*(?=│)", line) for line in table.splitlines())
    return {c[0]: c[1] for c in cells if len(c) == 2}


def test_the_worked_example_shows_what_autotune_estimate_prints() -> None:
    command = re.search(r"^autotune estimate --model Qwen/Qwen3-8B (.*)$", README, re.M)
    assert command, "the README's worked example names no `autotune estimate --model Qwen/Qwen3-8B` command"
    shown = rows(README[command.end():].split("```", 3)[2])
    out = CliRunner().invoke(main, ["estimate", "--model", str(QWEN3_8B), *shlex.split(command.group(1))])
    assert out.exit_code == 0, out.output
    printed = rows(out.output)
    assert len(shown) >= 5 and {k: printed.get(k) for k in shown} == shown


def test_the_worked_examples_study_file_loads(tmp_path: Path) -> None:
    study = re.search(r"^```toml\n(.*?)^```", README[README.index("## Your model on your GPU"):], re.M | re.S)
    assert study, "the worked example shows no study file"
    text = study.group(1).replace('path = "Qwen/Qwen3-8B"', f'path = "{QWEN3_8B}"')
    assert str(QWEN3_8B) in text
    (tmp_path / "studies").mkdir()
    shutil.copytree(ROOT / "objectives", tmp_path / "objectives")
    (tmp_path / "studies" / "qwen3-8b-rtx4090.toml").write_text(text)
    spec = load_study(tmp_path / "studies" / "qwen3-8b-rtx4090.toml")
    assert spec.hardware == "rtx4090" and [b.name for b in spec.baselines] == ["vllm-defaults"]
    out = CliRunner().invoke(main, ["estimate", str(tmp_path / "studies" / "qwen3-8b-rtx4090.toml"), "-n", "2"])
    assert out.exit_code == 0 and "fits" in out.output, out.output


def test_the_readme_is_a_users_page_that_starts_with_its_two_commands() -> None:
    lines = README.splitlines()
    first_block = README.split("```")[1].splitlines()[1:]
    assert [line.split()[:2] for line in first_block] == [["make", "run"], ["make", "test"]]
    assert any(line.startswith("autotune run ") for line in lines[:40])
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the details belong in docs/"
