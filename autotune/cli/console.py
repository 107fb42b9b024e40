"""The two consoles every command prints on: results to stdout, errors and notes to stderr."""

from __future__ import annotations

from rich.console import Console

console = Console(highlight=False)
if not console.is_terminal:  # piped or captured: wide enough that tables stay readable in a log
    console = Console(highlight=False, width=160)
err_console = Console(stderr=True, highlight=False)
