"""One-line notices on stderr, each said once per process: an old spelling still read (a key, an option name)."""

from __future__ import annotations

import sys

_said: set[str] = set()


def notice(message: str) -> None:
    """Print `message` on stderr as "notice: ...", unless this process has said it already."""
    if message not in _said:
        _said.add(message)
        print(f"notice: {message}", file=sys.stderr)


def old_names_notice(where: str, old: list[str], new: dict[str, str]) -> None:
    """The notice for figures or keys read under their old names: "objective.toml: [limits] read ttft_p95_ms as
    p95_ttft_ms (vLLM bench's name)"."""
    if old:
        pairs = ", ".join(f"{k} as {new[k]}" for k in old)
        notice(f"{where}: read {pairs} (the names `vllm bench serve` uses; the old ones will stop being read)")
