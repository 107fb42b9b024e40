"""The README's worked example prints what `autotune estimate` prints today for the command it shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from autotune.cli import main

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
