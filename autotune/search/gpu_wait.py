"""The wait for a free GPU before a boot. Memory in use on the GPU beyond what was when the run began (planned
around: feasibility.planned_profiles) would be misread as the next configuration's failure: a previous server may
still be letting go, so the loop waits a while, then refuses to boot and names what holds the card."""

from __future__ import annotations

import time
from collections.abc import Callable

from autotune.fit.hardware import GpuInfo
from autotune.search.slots import Slot, present_gpus
from autotune.units import GiB, MiB, format_gib

# More in use before a boot than this, and than what was in use when the run began (planned around) by more than
# HELD_MORE_BYTES, means something else holds the GPU (an idle card shows its driver's reserve, 0.4-0.6 GiB, as used).
HELD_GPU_BYTES = 1 * GiB
HELD_MORE_BYTES = 256 * MiB


def taken_since_start(gpus: list[GpuInfo], used_at_start: dict[int, int]) -> list[GpuInfo]:
    """The GPUs on which something took memory since the run began (what was in use then is planned around)."""
    return [g for g in gpus if g.used_bytes > max(used_at_start.get(g.index, 0) + HELD_MORE_BYTES, HELD_GPU_BYTES)]


def still_taken(slot: Slot, used_at_start: dict[int, int], waiting: Callable[[], object],
                wait_s: float = 30.0) -> str:
    """Wait up to `wait_s` for the slot's GPUs to be let go (calling `waiting` each time round); "" once they are,
    else what holds them, e.g. "GPU 0: 3.2 GiB in use"."""
    deadline = time.monotonic() + wait_s
    while busy := taken_since_start(present_gpus((slot,)), used_at_start):
        if time.monotonic() > deadline:
            return ", ".join(f"GPU {g.index}: {format_gib(g.used_bytes, 1)} in use" for g in busy)
        waiting()
        time.sleep(2)
    return ""
