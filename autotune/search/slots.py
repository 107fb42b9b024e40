"""Where trials run: one slot per GPU (`--gpus`) or per CPU-build server (`--workers`), each running one trial
at a time."""

from __future__ import annotations

import os
from dataclasses import dataclass

from autotune.engine.flags import Build, detect_build
from autotune.errors import SpecError
from autotune.fit.hardware import GpuInfo, detect_gpus


@dataclass(frozen=True)
class Slot:
    """Where one trial at a time runs: a GPU (or several, for one server) or, on the CPU build, a share of it."""

    name: str = "0"
    gpu_indices: tuple[int, ...] = ()

    @property
    def cuda_visible_devices(self) -> str | None:
        return ",".join(map(str, self.gpu_indices)) if self.gpu_indices else None


def slot_gpus(gpus: list[GpuInfo], slots: tuple[Slot, ...]) -> list[GpuInfo]:
    """The GPUs the slots' servers run on: those --gpus names, else the first (where CUDA puts one server)."""
    used = {i for slot in slots for i in slot.gpu_indices}
    return [g for g in gpus if g.index in used] if used else gpus[:1]


def present_gpus(slots: tuple[Slot, ...] = (Slot(),)) -> list[GpuInfo]:
    """The slots' GPUs as NVML finds them now (none on the CPU build)."""
    return [] if detect_build() is Build.CPU else slot_gpus(detect_gpus(), slots)


def slots_for(workers: int | None, gpus: str | None) -> tuple[Slot, ...]:
    """The slots `--workers N` or `--gpus 0,1` ask for (check_slots_fit: whether this machine can give them)."""
    if workers is not None and gpus is not None:
        raise SpecError("--workers", None, "give --workers (CPU build) or --gpus (one trial per GPU), not both")
    if gpus is not None:
        return tuple(Slot(str(i), (i,)) for i in gpu_indices(gpus))
    if workers is not None and workers < 1:
        raise SpecError("--workers", None, f"must be at least 1, got {workers}")
    return tuple(Slot(str(i)) for i in range(workers or 1))


def gpu_indices(text: str, flag: str = "--gpus") -> tuple[int, ...]:
    """Distinct GPU indices from "0,1,2" (whether this machine has them: check_slots_fit)."""
    try:
        indices = [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise SpecError(flag, text, "expected GPU indices such as 0,1,2") from None
    if not indices or len(set(indices)) != len(indices) or min(indices) < 0:
        raise SpecError(flag, text, "expected distinct GPU indices such as 0,1,2")
    return tuple(indices)


def check_slots_fit(slots: tuple[Slot, ...], flag: str = "--gpus") -> tuple[Slot, ...]:
    """--gpus names GPUs this machine has (the CPU build uses none); --workers runs at most one server per core:
    more CPU-build servers than cores time-share them, and every figure measured would be the crowd's, not the
    configuration's."""
    wanted = [i for slot in slots for i in slot.gpu_indices]
    if wanted:
        gpus = ",".join(map(str, wanted))
        if detect_build() is Build.CPU:
            raise SpecError(flag, gpus, "the installed vLLM is the CPU build, which uses no GPU"
                            + ("; use --workers" if flag == "--gpus" else ""))
        present = sorted(g.index for g in detect_gpus())
        if missing := [i for i in wanted if i not in present]:
            have = f"GPUs {', '.join(map(str, present))}" if present else "no GPU NVML can see"
            raise SpecError(flag, gpus, f"no GPU {', '.join(map(str, missing))} on this machine (it has {have})")
    elif len(slots) > (cores := len(os.sched_getaffinity(0))):
        raise SpecError("--workers", str(len(slots)), f"more servers than the {cores} core(s) this process may use; "
                                                     f"at most --workers {cores}")
    return slots
