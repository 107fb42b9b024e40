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

# A path into the catalogue as prose and code cite it: benchmarks/data/ and a lower-case name or a glob, up to a
# character that cannot be part of a path (an upper-case placeholder such as DATASET is a template, not a path).
# Trailing punctuation of a sentence is not part of it.
CITED = re.compile(r"benchmarks/data/([a-z0-9*][A-Za-z0-9_./*-]*)")
# The same as code joins it: "benchmarks" / "data" / "NAME...", or catalogue.dataset("NAME...").
JOINED = re.compile(r'(?:"benchmarks"\s*/\s*"data"\s*/\s*|\b(?:dataset|surface_boots)\()"([a-z0-9*][A-Za-z0-9_./*-]*)"')
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
    return [m.rstrip(".") for m in CITED.findall(text) + JOINED.findall(text)]


# Where the catalogue is cited: the user's pages, the product, its tests, the benchmarks and the shipped studies.
CITING_ROOTS = ("README.md", "CONTRIBUTING.md", "docs", "autotune", "tests", "benchmarks", "studies")
CITING_SUFFIXES = (".md", ".py", ".toml", ".sh", ".txt", ".cfg", ".yml", ".yaml")


def citing_files(repo: Path = REPO) -> list[Path]:
    """The text files that may cite the catalogue (the datasets' own data files excluded, their READMEs kept)."""
    out = []
    for root in CITING_ROOTS:
        base = repo / root
        paths = [base] if base.is_file() else sorted(base.rglob("*"))
        out += [p for p in paths if p.is_file() and p.suffix in CITING_SUFFIXES
                and (not p.is_relative_to(DATA) or p.suffix == ".md")]
    return out


def citations(repo: Path = REPO) -> dict[str, list[tuple[Path, str]]]:
    """Each cited catalogue path (relative to benchmarks/data/) with the files citing it."""
    out: dict[str, list[tuple[Path, str]]] = {}
    for path in citing_files(repo):
        for cited in cited_paths(path.read_text(errors="replace")):
            out.setdefault(cited, []).append((path, cited))
    return out


def main() -> None:
    """Print each dataset the manifest lists with the files that cite it."""
    cited = citations()
    for name in manifest_datasets():
        files = sorted({str(p.relative_to(REPO)) for c, refs in cited.items() if c.split("/")[0] == name
                        for p, _ in refs})
        print(f"{name}: {', '.join(files) or 'not cited'}")


if __name__ == "__main__":
    main()
