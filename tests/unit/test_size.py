"""The size check of `make lint` (scripts/check_size.py): it finds a module over 450 lines and a function over 60,
and the product passes it."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_size.py"
check_size = runpy.run_path(str(SCRIPT))


def function_of(lines: int, name: str = "f") -> str:
    """A function of exactly `lines` lines, its `def` included."""
    return f"def {name}():\n" + "    x = 1\n" * (lines - 1)


def test_a_function_over_60_lines_and_a_module_over_450_are_named_with_their_line(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("\n" * 10 + function_of(61, "too_long") + function_of(60, "just_fits"))
    (tmp_path / "big.py").write_text("x = 1\n" * 451)
    (tmp_path / "fits.py").write_text("x = 1\n" * 450)
    found = check_size["offenders"](tmp_path)
    assert found == [f"{tmp_path / 'big.py'}:1: module of 451 lines (at most 450)",
                     f"{tmp_path / 'long.py'}:11: function too_long of 61 lines (at most 60)"]


def test_methods_and_nested_functions_count_too(tmp_path: Path) -> None:
    nested = "class C:\n    def m(self):\n" + "        x = 1\n" * 30 + "        def inner():\n" + \
        "            y = 2\n" * 61
    (tmp_path / "nested.py").write_text(nested)
    assert [line.split(": ", 1)[1] for line in check_size["offenders"](tmp_path)] == [
        "function m of 93 lines (at most 60)", "function inner of 62 lines (at most 60)"]


def test_the_product_passes_the_size_check() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), str(ROOT / "autotune")], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == "", run.stdout
