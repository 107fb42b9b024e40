"""Units of memory, one definition each."""

from __future__ import annotations

MiB = 1 << 20
GiB = 1 << 30


def format_gib(n: float, digits: int = 2) -> str:
    """Bytes as the tables and messages show them: "1.50 GiB"."""
    return f"{n / GiB:.{digits}f} GiB"
