"""The study and objective file reference in docs/ is written from the parsers: every key they read is described,
none that they no longer read, and the pages in docs/ are what the generator writes today."""

from __future__ import annotations

from pathlib import Path

from autotune.config import reference
from autotune.config.reference import Key, asked_keys, undescribed
from autotune.config.toml import TomlTable, read_toml

DOCS = Path(__file__).parents[3] / "docs"


def test_every_key_the_study_and_objective_parsers_read_is_described() -> None:
    assert undescribed(reference.study_keys(), reference.STUDY_KEYS) == []
    assert undescribed(reference.objective_keys(), reference.OBJECTIVE_KEYS) == []


def test_no_description_is_left_for_a_key_the_parsers_no_longer_read() -> None:
    assert set(reference.STUDY_KEYS) - {k.dotted for k in reference.study_keys()} == set()
    assert set(reference.OBJECTIVE_KEYS) - {k.dotted for k in reference.objective_keys()} == set()


def test_a_key_a_parser_starts_to_read_is_found_with_its_default(tmp_path: Path) -> None:
    file = tmp_path / "new.toml"
    file.write_text('[load]\nmode = "rate"\n')

    def load_with_a_new_key(path: Path) -> None:
        top = TomlTable(read_toml(path, str(path)), str(path))
        top.table("load").get("burst", 8)
        top.get("colour", "blue")

    keys = asked_keys(load_with_a_new_key, [file])
    assert Key("load", "burst", 8) in keys and Key("", "colour", "blue") in keys
    assert undescribed(keys, reference.OBJECTIVE_KEYS) == ["load.burst", "colour"]


def test_the_reference_in_docs_is_what_the_parsers_give_today() -> None:
    for name, page in reference.PAGES.items():
        assert (DOCS / name).read_text() == page(), f"docs/{name} is stale: python -m autotune.config.reference docs"
