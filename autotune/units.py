"""Units of memory, one definition each."""

from __future__ import annotations

MiB = 1 << 20
GiB = 1 << 30
