"""What `autotune run` fetches before the first boot is what vLLM loads: a tiny model with real weights (three
safetensors shards and their index, a copy under original/ and a README beside them) served by a hub on 127.0.0.1,
fetched by the run, then booted by vLLM's CPU build with the hub switched off (HF_HUB_OFFLINE in the server's
environment), so the trial's boot needs nothing the fetch did not bring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from autotune.engine.models import tiny_model_dir
from benchmarks.engine_lock import engine_lock
from tests.hub_server import FakeHub

ROOT = Path(__file__).resolve().parents[2]
REPO = "autotune-tests/tiny-dense-weights"


def checkpoint(tmp: Path) -> dict[str, bytes]:
    """The tiny dense model's config and tokenizer with random weights saved as a hub checkpoint (sharded)."""
    tiny = tiny_model_dir("dense")
    config = json.loads((tiny / "config.json").read_text())
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**{k: v for k, v in config.items() if k != "architectures"}))
    model.save_pretrained(tmp, max_shard_size="8MB", safe_serialization=True)
    files = {p.name: p.read_bytes() for p in tmp.glob("*.safetensors")}
    files["model.safetensors.index.json"] = (tmp / "model.safetensors.index.json").read_bytes()
    files["config.json"] = (tiny / "config.json").read_bytes()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        files[name] = (tiny / name).read_bytes()
    files["original/consolidated.safetensors"] = next(iter(files.values()))  # vLLM's loader skips it; so must we
    files["README.md"] = b"# tiny dense, random weights\n"
    return files


def test_the_fetched_checkpoint_boots_with_the_hub_switched_off(tmp_path: Path) -> None:
    files = checkpoint(tmp_path / "saved")
    shards = sorted(n for n in files if n.startswith("model-") and n.endswith(".safetensors"))
    assert len(shards) >= 2
    quick = (ROOT / "tests" / "data" / "quick" / "quick.toml").read_text()
    study = tmp_path / "study" / "fetched.toml"
    study.parent.mkdir()
    (study.parent / "quick-objective.toml").write_text(
        (ROOT / "tests" / "data" / "quick" / "quick-objective.toml").read_text())
    study.write_text(quick.replace("name = \"quick\"", "name = \"fetched\"")
                     .replace('path = "tiny:dense"\nload_format = "dummy"', f'path = "{REPO}"')
                     .replace('VLLM_CPU_KVCACHE_SPACE = "1"', 'VLLM_CPU_KVCACHE_SPACE = "1"\nHF_HUB_OFFLINE = "1"'))
    assert f'path = "{REPO}"' in study.read_text() and "dummy" not in study.read_text()
    cache = tmp_path / "hf"
    with FakeHub(REPO, files) as hub, engine_lock():
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_XET": "1",
               "COLUMNS": "160"}
        run = subprocess.run([sys.executable, "-m", "autotune.cli", "run", str(study), "--n-trials", "1"],
                             cwd=study.parent, env=env, capture_output=True, text=True, timeout=1200)
        fetched = sorted({path.rsplit("/resolve/", 1)[-1].split("/", 1)[-1] for method, path, _ in hub.requests
                          if method == "GET" and "/resolve/" in path})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"fetching {REPO} before the first boot: {len(shards)} weight file(s)" in run.stdout
    assert fetched == sorted(["config.json", "model.safetensors.index.json", "tokenizer.json",
                              "tokenizer_config.json", *shards])  # not original/, not the README
    [trial] = optuna.load_study(study_name="fetched", storage=f"sqlite:///{study.parent / 'fetched.db'}").trials
    assert trial.user_attrs.get("kv_cache_tokens"), trial.user_attrs.get("reason")  # it booted
    log = next((study.parent / "fetched-artifacts").glob("trial-0000.log")).read_text()
    assert "dummy" not in trial.user_attrs["vllm_command"]  # the real weights, loaded from the cache alone:
    assert "HF_HUB_OFFLINE is True, replace model_id" in log, log[-2000:]
    assert f"Loading safetensors checkpoint shards: 100% Completed | {len(shards)}/{len(shards)}" in log
