"""Energy per output token from NVML, sampled through a load level.

A thread reads each GPU's power draw (nvmlDeviceGetPowerUsage, mW) and, where the card has one, its total-energy
counter (nvmlDeviceGetTotalEnergyConsumption, mJ since the driver loaded; Volta and later) every `interval_s`.
The energy of a window is the counter's difference where every sample has one (exact whatever the interval), else
the power integrated over the samples (trapezoids). Joules per output token is that energy over the level's steady
window divided by the output tokens in the same window: the same window its throughput is measured over.

On the CPU build there is no NVML: energy is not measured, and every figure says so (None), never an estimate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pynvml


@dataclass(frozen=True)
class PowerSample:
    """One reading of the GPUs a server uses, summed over them."""

    t: float  # time.perf_counter(), the client's clock
    watts: float
    energy_j: float | None  # the summed total-energy counters; None when any card has none


def read_power(handles: Sequence[object]) -> PowerSample:
    """Power and energy counters of `handles` (NVML device handles), now."""
    watts, energy_mj, counted = 0.0, 0, True
    for handle in handles:
        watts += pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        try:
            energy_mj += pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError:  # NOT_SUPPORTED before Volta: power alone
            counted = False
    return PowerSample(time.perf_counter(), watts, energy_mj / 1000.0 if counted else None)


def energy_between(samples: Sequence[PowerSample], t0: float, t1: float) -> float | None:
    """Joules spent in [t0, t1], or None when the samples do not cover it (a sample at or before t0 and one at or
    after t1). The counter is interpolated linearly at both ends; without one, power is integrated."""
    if t1 <= t0 or not samples or samples[0].t > t0 or samples[-1].t < t1:
        return None
    if all(s.energy_j is not None for s in samples):
        return _at(samples, t1, _energy) - _at(samples, t0, _energy)
    inside = [s for s in samples if t0 < s.t < t1]
    points = [(t0, _at(samples, t0, _watts)), *((s.t, s.watts) for s in inside), (t1, _at(samples, t1, _watts))]
    return sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(points, points[1:], strict=False))


def _energy(s: PowerSample) -> float:
    assert s.energy_j is not None
    return s.energy_j


def _watts(s: PowerSample) -> float:
    return s.watts


def _at(samples: Sequence[PowerSample], t: float, value: Callable[[PowerSample], float]) -> float:
    """`value` linearly interpolated at time t between the samples around it."""
    after = next(i for i, s in enumerate(samples) if s.t >= t)
    b = samples[after]
    if after == 0 or b.t == t:
        return value(b)
    a = samples[after - 1]
    return value(a) + (value(b) - value(a)) * (t - a.t) / (b.t - a.t)


def joules_per_token(samples: Sequence[PowerSample], t0: float, t1: float, output_tokens: float) -> float | None:
    """Energy in the window over the output tokens in it; None when not measured or no token was made."""
    energy = energy_between(samples, t0, t1)
    return energy / output_tokens if energy is not None and output_tokens > 0 else None


class PowerSampler:
    """Samples the power of `gpu_indices` every `interval_s` on a thread, from start() to stop().

    `reader` replaces NVML (tests of the sampling loop); with NVML, NVMLError propagates from start(): asked
    for power where there is no NVML."""

    def __init__(self, gpu_indices: Sequence[int], interval_s: float = 0.1,
                 reader: Callable[[], PowerSample] | None = None):
        self.gpu_indices, self.interval_s, self._reader = tuple(gpu_indices), interval_s, reader
        self.samples: list[PowerSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> PowerSample:
        if self._reader is not None:
            return self._reader()
        return read_power([pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.gpu_indices])

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self._read())

    def start(self) -> PowerSampler:
        if self._reader is None:
            pynvml.nvmlInit()
        self.samples.append(self._read())
        self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[PowerSample]:
        if self._thread is None:
            raise RuntimeError("PowerSampler was not started")
        self._stop.set()
        self._thread.join()
        try:
            self.samples.append(self._read())  # the window's end is covered
        finally:
            if self._reader is None:
                pynvml.nvmlShutdown()
        return self.samples

    def __enter__(self) -> PowerSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
