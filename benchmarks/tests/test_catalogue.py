"""The evidence catalogue holds together: every benchmarks/data path cited anywhere exists and names a dataset the
manifest lists, every dataset folder is listed, and the catalogue's JSON layout keeps the data as it was."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmarks import catalogue
from benchmarks.catalogue import DATA, citations, cited_paths, dumps_json, manifest_datasets, read_log


def test_every_cited_path_exists_and_is_a_listed_dataset() -> None:
    listed = set(manifest_datasets())
    cited = citations()
    assert cited, "nothing cites the catalogue: the scan is broken"
    missing = sorted(f"{p.relative_to(catalogue.REPO)}: benchmarks/data/{c}" for c, refs in cited.items()
                     for p, _ in refs if not any(DATA.glob(c)))
    unlisted = sorted(f"{p.relative_to(catalogue.REPO)}: {c}" for c, refs in cited.items() for p, _ in refs
                      if c != "MANIFEST.md" and not {d.relative_to(DATA).parts[0] for d in DATA.glob(c)} <= listed)
    assert not missing, "cited but not in benchmarks/data:\n" + "\n".join(missing)
    assert not unlisted, "cited but not a dataset MANIFEST.md lists:\n" + "\n".join(unlisted)


def test_the_manifest_lists_every_dataset_folder_and_nothing_else() -> None:
    folders = sorted(p.name for p in DATA.iterdir() if p.is_dir())
    assert sorted(manifest_datasets()) == folders
    assert sorted(p.name for p in DATA.iterdir() if p.is_file()) == ["MANIFEST.md"]


def test_logs_are_kept_compressed() -> None:
    plain = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.suffix in (".log", ".out"))
    assert not plain


def test_json_is_kept_indented() -> None:
    one_line = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.json") if p.read_text().count("\n") <= 1)
    assert not one_line


def test_a_citation_is_read_without_the_sentence_around_it(tmp_path: Path) -> None:
    text = ("served 793 (benchmarks/data/h100-as-rtx3090-awq-marlin/surface.json). See benchmarks/data/h200-cuda-boots,"
            ' benchmarks/data/*-as-rtx3090-*/surface.json, benchmarks/data/DATASET/surface.json (a template) and'
            ' REPO / "benchmarks" / "data" / "cpu-tiny-grid/surface.json"')
    assert cited_paths(text) == ["h100-as-rtx3090-awq-marlin/surface.json", "h200-cuda-boots",
                                 "*-as-rtx3090-*/surface.json", "cpu-tiny-grid/surface.json"]
    manifest = tmp_path / "MANIFEST.md"
    manifest.write_text("# Catalogue\n\n## `one-dataset`\n\ntext\n\n## two\n\n### not a dataset\n")
    assert manifest_datasets(manifest) == ["one-dataset", "two"]


@pytest.mark.parametrize("doc", [{"records": [[0.1, None, "x, y"], [2, 3]], "k": {"empty": [], "s": "a\nb ["}},
                                 [1, [2, [3, 4]], {"z": [5]}]])
def test_the_indented_layout_changes_no_value(doc: object) -> None:
    text = dumps_json(doc)
    assert json.loads(text) == doc
    assert text.count("\n") > 1


def test_a_record_is_one_line() -> None:
    one_record = {"records": [[0.1, 0.2, 3.0, 1, None]]}
    assert dumps_json(one_record) == '{\n "records": [\n  [0.1, 0.2, 3.0, 1, null]\n ]\n}\n'


def test_a_log_reads_the_same_compressed_or_not(tmp_path: Path) -> None:
    text = "INFO Available KV cache memory: 2.49 GiB\n"
    (tmp_path / "a.log").write_text(text)
    (tmp_path / "a.log.gz").write_bytes(gzip.compress(text.encode()))
    assert read_log(tmp_path / "a.log") == read_log(tmp_path / "a.log.gz") == text
