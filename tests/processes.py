"""What engine tests look for after a run: any vLLM server process left on this machine."""

from __future__ import annotations

import psutil


def vllm_processes() -> list[psutil.Process]:
    """API servers (by their module) and engine processes (vLLM names them VLLM::EngineCore, VLLM::Worker)."""
    found = []
    for p in psutil.process_iter(["cmdline", "name"]):
        if "vllm.entrypoints" in " ".join(p.info["cmdline"] or []) or (p.info["name"] or "").startswith("VLLM::"):
            found.append(p)
    return found
