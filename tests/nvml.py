"""Whether this machine has an NVIDIA driver NVML can reach: the tests of the real NVML path run only where it can."""

from __future__ import annotations

import pynvml


def nvml_available() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True
