"""Processes the tests look for: vLLM servers left on this machine, process groups that should be gone."""

from __future__ import annotations

import os
import time

import psutil


def vllm_processes() -> list[psutil.Process]:
    """API servers (by their module) and engine processes (vLLM names them VLLM::EngineCore, VLLM::Worker)."""
    found = []
    for p in psutil.process_iter(["cmdline", "name"]):
        if "vllm.entrypoints" in " ".join(p.info["cmdline"] or []) or (p.info["name"] or "").startswith("VLLM::"):
            found.append(p)
    return found


def within(seconds: float, condition) -> bool:
    """Polls (a busy 2-core machine can be slow): whether `condition()` comes true in time."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def group_gone(pgid: int) -> bool:
    """No process of the group is left, within a generous minute."""
    def gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False
    return within(60, gone)
