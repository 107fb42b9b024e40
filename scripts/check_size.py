"""The size check of `make lint`: no module of autotune/ over 450 lines and no function over 60, so that each
reads in one sitting. Prints every offender as path:line and exits 1 if there is any."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def offenders(root: Path) -> list[str]:
    """Each module over MAX_MODULE_LINES and each function (method, nested function) over MAX_FUNCTION_LINES,
    counted from its `def` (decorators aside) to its last line, docstring included."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            out.append(f"{path}:1: module of {lines} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(f"{path}:{node.lineno}: function {node.name} of {length} lines "
                               f"(at most {MAX_FUNCTION_LINES})")
    return out


def main(argv: list[str]) -> int:
    found = [line for root in (argv or ["autotune"]) for line in offenders(Path(root))]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
