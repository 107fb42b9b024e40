"""The real NVML sampling path of energy per token, on a machine with an NVIDIA GPU (skipped where there is none; it
imports nothing but the sampler, so it runs wherever NVML and PyTorch are, without the rest of autotune's needs)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from autotune.measure.energy import PowerSample, PowerSampler, energy_between
from tests.nvml import nvml_available

# A child that keeps the GPU busy for 3 s: PyTorch where it is installed, else a CUDA context that idles.
LOAD = ("import time\n"
        "try:\n"
        "    import torch\n"
        "    a = torch.randn(4096, 4096, device='cuda')\n"
        "    end = time.time() + 3\n"
        "    while time.time() < end:\n"
        "        a @ a; torch.cuda.synchronize()\n"
        "except ImportError:\n"
        "    time.sleep(3)\n")


@pytest.mark.skipif(not nvml_available(), reason="needs an NVIDIA GPU and driver")
def test_power_is_sampled_through_a_level_on_a_real_gpu() -> None:
    with PowerSampler([0], interval_s=0.05) as sampler:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", LOAD], check=True, timeout=120)
        ended = time.perf_counter()
    samples = sampler.samples
    assert len(samples) >= 20 and samples[0].t <= started and samples[-1].t >= ended
    assert all(0 < s.watts < 2000 for s in samples)  # one card: more than nothing, less than any card draws
    energy = energy_between(samples, started, ended)
    assert energy is not None and energy > 0
    if samples[0].energy_j is not None:  # Volta and later: the counter, and the power integrated, agree
        power_only = [PowerSample(s.t, s.watts, None) for s in samples]
        assert energy_between(power_only, started, ended) == pytest.approx(energy, rel=0.15)
