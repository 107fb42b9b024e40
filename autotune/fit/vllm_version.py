"""Which vLLM version the memory model predicts for: one it models (its terms read in that version's source, its
constants fitted on that version's boots), or, for another, the nearest it models with a wider range.

vLLM's memory accounting moves between releases (tests/data/gpu-boots/VLLM-MEMORY-0.25.md and VLLM-MEMORY-0.32.md
give each term with its source lines), so a prediction names the version it modelled. A version that is not modelled
is predicted with the nearest modelled one (by release number), its non-KV band widened (fit/vllm_memory.py
version_terms): the configuration is then booted to learn rather than refused on another version's figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from autotune.errors import SpecError

# Newest last. A version is modelled when fit/vllm_memory.py has its terms (VERSION_TERMS).
MODELLED_VERSIONS = ("0.25.0", "0.32.0")


@dataclass(frozen=True)
class ModelledVersion:
    """The version a prediction was asked for and the one whose terms it used."""

    asked: str  # as given (or installed)
    modelled: str  # one of MODELLED_VERSIONS

    @property
    def exact(self) -> bool:
        return _release(self.asked) == _release(self.modelled)

    @property
    def label(self) -> str:
        """How every output names it: 'vLLM 0.32.0', or what stood in for another."""
        if self.exact:
            return f"vLLM {self.modelled}"
        return f"vLLM {self.asked} as {self.modelled}"

    @property
    def note(self) -> str:
        """Empty when modelled; else one line saying what was done instead."""
        if self.exact:
            return ""
        return (f"vLLM {self.asked} is not modelled (modelled: {', '.join(MODELLED_VERSIONS)}): "
                f"predicted with {self.modelled}, the nearest, with a wider range")


def parse_vllm_version(text: str, source: str = "--vllm-version", key: str | None = None) -> str:
    """A version as given on the command line (source: the option) or in a study file (source: the file, key: its
    key); SpecError naming it when it is not one."""
    try:
        Version(text)
    except InvalidVersion:
        why = (f"is not a vLLM version (e.g. {MODELLED_VERSIONS[-1]}); modelled: {', '.join(MODELLED_VERSIONS)}")
        raise SpecError(source, key or text, f"{text!r} {why}" if key else why) from None
    return text.strip()


def modelled_version(asked: str | None) -> ModelledVersion:
    """The modelled version nearest to `asked` by release (major, minor, micro); the newer of two equally near;
    the newest for an unreadable one. None (no version given or installed) is the newest, as modelled."""
    if asked is None:
        return ModelledVersion(MODELLED_VERSIONS[-1], MODELLED_VERSIONS[-1])
    release = _release(asked)
    if release is None:
        return ModelledVersion(asked, MODELLED_VERSIONS[-1])
    nearest = min(reversed(MODELLED_VERSIONS), key=lambda m: _distance(release, _release(m) or (0, 0, 0)))
    return ModelledVersion(asked, nearest)


def _release(text: str) -> tuple[int, int, int] | None:
    try:
        parts = Version(text).release
    except InvalidVersion:
        return None
    return (parts + (0, 0, 0))[:3]  # type: ignore[return-value]


def _distance(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return abs(a[0] - b[0]), abs(a[1] - b[1]), abs(a[2] - b[2])
