"""A hub checkpoint on disk before the first boot: the files vLLM's loader picks, judged in a real Hugging Face
cache layout (huggingface_hub reads it), and one line when the hub cannot give them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
from click.testing import CliRunner, Result

from autotune.cli import main
from autotune.engine.weights import cached_checkpoint, fetch, needs_fetch, weight_files
from autotune.errors import ModelUnavailable
from tests.hub_server import FakeHub

ROOT = Path(__file__).resolve().parents[3]
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
NOBODY = "autotune-tests/no-such-checkpoint-0b7e"  # no such repository: with a network or without, it fails


def cache_with(cache: Path, repo: str, files: list[str], index: dict | None = None) -> Path:
    """A snapshot as huggingface_hub lays one out (refs/main names the commit whose folder holds the files)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    snapshot = root / "snapshots" / COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "autotune" / "engine" / "known_models" / "qwen3.5-27b-awq.json", snapshot / "config.json")
    if index is not None:
        (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    for name in files:
        (snapshot / name).write_bytes(b"\0")
    return snapshot


def test_the_files_are_those_vllm_loads() -> None:
    index = {"weight_map": {"a.weight": SHARDS[0], "b.weight": SHARDS[1], "c.weight": SHARDS[0]}}
    listed = ["config.json", *SHARDS, "original/consolidated.safetensors", "pytorch_model.bin"]
    assert weight_files(listed, index) == SHARDS  # the index's shards, not original/'s copy
    assert weight_files(listed, None) == sorted([*SHARDS, "original/consolidated.safetensors"])
    assert weight_files(["config.json", "pytorch_model.bin"], None) == ["pytorch_model.bin"]
    assert weight_files(["config.json", "README.md"], None) == []


def test_only_a_hub_id_with_real_weights_is_fetched(tmp_path: Path) -> None:
    assert needs_fetch("Qwen/Qwen3.5-27B-GPTQ-Int4", {})
    assert not needs_fetch("Qwen/Qwen3.5-27B-GPTQ-Int4", {"load_format": "dummy"})  # the device's studies
    assert not needs_fetch("tiny:hybrid", {})
    assert not needs_fetch(str(tmp_path), {})


def test_a_complete_snapshot_is_used_as_it_is_and_a_missing_shard_is_not(tmp_path: Path) -> None:
    index = {"weight_map": {"a.weight": SHARDS[0], "b.weight": SHARDS[1]}}
    snapshot = cache_with(tmp_path, "autotune-tests/cached", SHARDS, index)
    said: list[str] = []
    assert cached_checkpoint("autotune-tests/cached", cache_dir=str(tmp_path)) == snapshot
    assert fetch("autotune-tests/cached", {"download_dir": str(tmp_path)}, said.append) == snapshot
    assert said == []  # nothing to fetch: no request, no line
    (snapshot / SHARDS[1]).unlink()  # an interrupted download
    assert cached_checkpoint("autotune-tests/cached", cache_dir=str(tmp_path)) is None
    assert cached_checkpoint("autotune-tests/never-cached", cache_dir=str(tmp_path)) is None


def error_lines(result: Result) -> list[str]:
    """What a command wrote to stderr: its error, in one line. Whatever this machine's CPU adds on stdout (the
    warning that bfloat16 is slow without AVX512-BF16) is not part of it: the tests hold on any CPU."""
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_weights_the_hub_cannot_give_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable, match="not in the local Hugging Face cache, and the hub could not give"):
        fetch(NOBODY, {"download_dir": str(tmp_path)}, print)


def test_a_run_whose_weights_cannot_be_fetched_stops_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's config.json is cached (so the study is valid and its estimate runs) but not its weights: the
    run says so in one line naming the key, before the database or any trial (vLLM would have failed each boot)."""
    cache = tmp_path / "hf"
    cache_with(cache, NOBODY, [])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    study = tmp_path / "s" / "fetch.toml"
    study.parent.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "quick" / "quick-objective.toml", study.parent)
    study.write_text(f"name = 'fetch'\nobjective = 'quick-objective.toml'\nhardware = 'cpu'\n"
                     f"[model]\npath = '{NOBODY}'\n")
    before = sorted(study.parent.iterdir())
    out = CliRunner().invoke(main, ["run", str(study), "--n-trials", "1"])
    lines = error_lines(out)
    assert out.exit_code == 2, out.output
    assert len(lines) == 1 and lines[0].startswith(f"error: {study}: model.path: cannot fetch '{NOBODY}': ")
    assert sorted(study.parent.iterdir()) == before


def test_a_trial_whose_weights_cannot_be_fetched_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hf"
    cache_with(cache, NOBODY, [])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # where `trial` would write its log
    objective = ROOT / "tests" / "data" / "quick" / "quick-objective.toml"
    out = CliRunner().invoke(main, ["trial", "--model", NOBODY, "--objective", str(objective)])
    lines = error_lines(out)
    assert out.exit_code == 2 and len(lines) == 1, out.output
    assert lines[0].startswith(f"error: --model: cannot fetch '{NOBODY}': ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


# --- against a hub served on 127.0.0.1 (tests/hub_server.py): huggingface_hub's own download code runs ----------

TINY = "autotune-tests/tiny"
BIG_SHARD = 10_000_000  # at FakeHub's slow rate (4 KB/s) this shard takes 40 minutes: nothing waits for it


def repository(big: bool = False) -> dict[str, bytes]:
    """A checkpoint as the hub holds one: the index's two shards, a copy vLLM skips under original/, a README."""
    index = {"metadata": {}, "weight_map": {"a.weight": SHARDS[0], "b.weight": SHARDS[1]}}
    config = (ROOT / "autotune" / "engine" / "known_models" / "qwen3.5-27b-awq.json").read_bytes()
    return {"config.json": config, "model.safetensors.index.json": json.dumps(index).encode(),
            "tokenizer.json": b"{}", SHARDS[0]: b"a" * 5_000, SHARDS[1]: b"b" * (BIG_SHARD if big else 7_000),
            "original/consolidated.safetensors": b"c" * 9_000, "README.md": b"# tiny"}


def hub_env(hub: FakeHub, cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_XET": "1"}


FETCH = f"from autotune.engine.weights import fetch; print(fetch({TINY!r}, {{}}))"


def test_a_fetch_downloads_the_files_vllm_loads_and_nothing_else(tmp_path: Path) -> None:
    cache = tmp_path / "hf"
    with FakeHub(TINY, repository()) as hub:
        out = subprocess.run([sys.executable, "-c", FETCH], env=hub_env(hub, cache), capture_output=True, text=True,
                             timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"fetching {TINY} before the first boot: 2 weight file(s)")
    folder = Path(out.stdout.strip().splitlines()[-1])
    got = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert got == sorted(["config.json", "model.safetensors.index.json", "tokenizer.json", *SHARDS])
    assert cached_checkpoint(TINY, cache_dir=str(cache)) == folder  # complete: the next run asks nothing


def test_ctrl_c_stops_a_fetch_at_once_and_the_next_run_fetches_only_the_rest(tmp_path: Path) -> None:
    """Ctrl-C in the middle of a shard: exit 130 with one line, no database, the files completed kept and the one
    in flight removed; the next fetch asks only for what is missing, and ends complete. huggingface_hub's threads
    alone would have finished the shard first (40 minutes here)."""
    cache, study = tmp_path / "hf", tmp_path / "s" / "fetch.toml"
    blobs = cache / f"models--{TINY.replace('/', '--')}" / "blobs"
    study.parent.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "quick" / "quick-objective.toml", study.parent)
    study.write_text(f"name = 'fetch'\nobjective = 'quick-objective.toml'\nhardware = 'cpu'\n"
                     f"[model]\npath = '{TINY}'\n")
    with FakeHub(TINY, repository(big=True), slow=(SHARDS[1],)) as hub:
        tuner = subprocess.Popen([sys.executable, "-m", "autotune.cli", "run", str(study), "--n-trials", "1"],
                                 env=hub_env(hub, cache), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        assert tuner.stdout is not None
        first = tuner.stdout.readline()
        while first.startswith("warning:"):  # what this machine adds (bfloat16 on a CPU without AVX512-BF16)
            first = tuner.stdout.readline()
        assert first.startswith(f"fetching {TINY} before the first boot")
        while hub.sent.get(SHARDS[1], 0) < 20_000 or not list(blobs.glob("*.incomplete")):
            time.sleep(0.2)  # the big shard is in flight (the small files are fetched in parallel)
        tuner.send_signal(signal.SIGINT)
        out, _ = tuner.communicate(timeout=600)
        sent = hub.sent[SHARDS[1]]
    assert tuner.returncode == 130, out
    assert "interrupted while fetching the weights; the files fetched are kept" in out
    assert sent < BIG_SHARD  # it did not wait for the shard
    assert sorted(p.name for p in study.parent.iterdir()) == ["fetch.toml", "quick-objective.toml"]
    assert not list(blobs.glob("*.incomplete")) and cached_checkpoint(TINY, cache_dir=str(cache)) is None
    had = {p.name for p in blobs.parent.glob("snapshots/*/*")}  # the files completed before the interrupt
    with FakeHub(TINY, repository(big=True)) as hub:
        done = subprocess.run([sys.executable, "-c", FETCH], env=hub_env(hub, cache), capture_output=True,
                              text=True, timeout=600, cwd=ROOT)
        fetched = {path.rsplit("/", 1)[-1] for method, path, _ in hub.requests
                   if method == "GET" and "/resolve/" in path}
    assert done.returncode == 0, done.stderr
    assert SHARDS[0] in had and SHARDS[1] in fetched and not fetched & had  # only the rest
    assert cached_checkpoint(TINY, cache_dir=str(cache)) is not None
