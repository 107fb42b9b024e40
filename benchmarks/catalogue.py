"""The evidence catalogue: benchmarks/data/ holds one folder per dataset, named by what it holds, and
benchmarks/data/MANIFEST.md lists each one (a `## name` heading) with what it is, its provenance and the figures
that cite it. Server logs are kept gzip-compressed; JSON is written indented with lists of numbers on one line,
so that a diff shows which configuration changed."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "data"
MANIFEST = DATA / "MANIFEST.md"

# A path into the catalogue as prose and code cite it: benchmarks/data/NAME[/more], up to a character that cannot
# be part of a path. Trailing punctuation of a sentence is not part of it.
CITED = re.compile(r"benchmarks/data/([A-Za-z0-9_.][A-Za-z0-9_./*-]*)")
# Lists of plain values (numbers, short strings, null) written on one line: records of requests, ladders, choices.
_FLAT_LIST = re.compile(r"\[\n[^\[\]{}]*?\n *\]")


def dataset(name: str) -> Path:
    """A dataset's folder, or a file in it: dataset("h200-as-rtx3090-awq/surface.json")."""
    return DATA / name


def read_log(path: Path) -> str:
    """A log's text, whether kept compressed (NAME.log.gz, as in the catalogue) or not (a fresh recording)."""
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode(errors="replace")
    return path.read_text(errors="replace")


def log_lines(path: Path) -> list[str]:
    return read_log(path).splitlines()


def dumps_json(doc: object) -> str:
    """`doc` indented one space per level, each list of plain values on one line (JSON strings hold no raw
    newline, so joining the lines of such a list changes only the layout)."""
    text = json.dumps(doc, indent=1)
    return _FLAT_LIST.sub(lambda m: re.sub(r"\[\n *", "[", re.sub(r",\n *", ", ", re.sub(r"\n *\]", "]", m.group(0)))),
                          text) + "\n"


def manifest_datasets(manifest: Path = MANIFEST) -> list[str]:
    """The dataset names the manifest lists, in its order: its `## name` headings."""
    return re.findall(r"^## `?([A-Za-z0-9][A-Za-z0-9._-]*)`?\s*$", manifest.read_text(), re.M)


def cited_paths(text: str) -> list[str]:
    """The catalogue paths `text` cites, relative to benchmarks/data/, without a sentence's trailing punctuation."""
    return [m.rstrip(".") for m in CITED.findall(text)]
