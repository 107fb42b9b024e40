"""Units of memory and time as they are printed, one definition each."""

from __future__ import annotations

MiB = 1 << 20
GiB = 1 << 30


def format_gib(n: float, digits: int = 2) -> str:
    """Bytes as the tables and messages show them: "1.50 GiB"."""
    return f"{n / GiB:.{digits}f} GiB"


def format_hms(seconds: float) -> str:
    """'4m05s', '1h02m': a time left or taken, as progress lines print it."""
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
