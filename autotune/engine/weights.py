"""A hub checkpoint on disk before the first boot.

vLLM downloads a hub model's weights inside its first boot (model_loader/weight_utils.py,
download_weights_from_hf), under the trial's boot timeout and on the budget's clock: a 27B model in 4 bits is
about 14-18 GB, so on a home connection the first boot of each checkpoint could time out and be recorded as its
configuration's failure. A run fetches them first, outside the budget, choosing the files as vLLM's loader does
(the shards the safetensors index names, else every *.safetensors, else *.bin) with the small files beside them,
into the cache vLLM reads (`download_dir`, else Hugging Face's).

The download runs in a child process (`python -m autotune.engine.weights`): huggingface_hub's download threads
finish their files before an interpreter exits, so a Ctrl-C in the tuner itself waited for the whole shard in
flight (seen: more than 2 minutes, tests/unit/engine/test_weights.py). A child is killed at once instead; the files
it completed stay in the cache, and the file in flight (a process-unique temporary file in huggingface_hub 2.x,
which does not resume it) is removed.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from autotune.engine.models import HUB_TIMEOUT_S, first_line
from autotune.engine.server import die_with_parent
from autotune.errors import ModelUnavailable, SpecError

INDEX = "model.safetensors.index.json"
SIDE_FILES = ["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken"]  # config, tokenizer, chat template


def needs_fetch(model: str, flags: Mapping[str, object]) -> bool:
    """A hub id served with its real weights: not tiny:KIND, not a directory, not `load_format = "dummy"`."""
    return not (model.startswith("tiny:") or Path(model).expanduser().is_dir() or flags.get("load_format") == "dummy")


def weight_files(files: list[str], index: Mapping[str, object] | None) -> list[str]:
    """The weight files vLLM loads from a repository holding `files`: the index's shards, else the first of
    *.safetensors and *.bin that matches (vLLM's default allow_patterns, in its order)."""
    if index is not None and isinstance(weight_map := index.get("weight_map"), dict) and weight_map:
        return sorted(set(map(str, weight_map.values())))
    for pattern in ("*.safetensors", "*.bin"):
        if found := fnmatch.filter(files, pattern):
            return sorted(found)
    return []


def cached_checkpoint(model: str, revision: str | None = None, cache_dir: str | None = None) -> Path | None:
    """The cached snapshot, if it holds config.json and every weight file vLLM would load; no network."""
    from huggingface_hub import snapshot_download

    try:
        # Only config.json asked: the cache also lists the repository's other files (README, original/...), and
        # asked for all, huggingface_hub 2.x calls a snapshot without them incomplete. The weights are checked here.
        folder = Path(snapshot_download(model, revision=revision, cache_dir=cache_dir, local_files_only=True,
                                        allow_patterns=["config.json"]))
    except Exception:  # not cached (LocalEntryNotFoundError, IncompleteSnapshotError), or an id no cache holds
        return None
    index_file = folder / INDEX
    try:
        index = json.loads(index_file.read_text()) if index_file.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None
    files = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
    weights = weight_files(files, index)
    if not (folder / "config.json").is_file() or not weights:
        return None
    return folder if all((folder / w).is_file() for w in weights) else None


def fetch(model: str, flags: Mapping[str, object], say: Callable[[str], object] = print) -> Path:
    """The checkpoint's snapshot folder, downloaded first where the cache lacks any of it (ModelUnavailable if
    the hub cannot give it: no network, offline mode, no such repository, gated)."""
    from huggingface_hub import HfApi, constants, hf_hub_download
    from huggingface_hub.file_download import repo_folder_name

    revision = str(flags["revision"]) if flags.get("revision") else None
    cache_dir = str(flags["download_dir"]) if flags.get("download_dir") else None
    if (folder := cached_checkpoint(model, revision, cache_dir)) is not None:
        return folder
    try:
        info = HfApi().model_info(model, revision=revision, timeout=HUB_TIMEOUT_S, files_metadata=True)
        sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
        index = (json.loads(Path(hf_hub_download(model, INDEX, revision=revision, cache_dir=cache_dir)).read_text())
                 if INDEX in sizes else None)
    except Exception as e:
        raise ModelUnavailable("its weights are not in the local Hugging Face cache, and the hub could not give "
                               f"them: {first_line(e)}") from e
    weights = weight_files(list(sizes), index)
    if not weights:
        raise ModelUnavailable(f"the repository holds no *.safetensors or *.bin weights (files: {len(sizes)})")
    total = sum(sizes.get(w, 0) for w in weights)
    say(f"fetching {model} before the first boot: {len(weights)} weight file(s), {total / 1e9:.1f} GB "
        "(vLLM would download them inside a trial's boot)")
    argv = [sys.executable, "-m", "autotune.engine.weights", model, *weights, *SIDE_FILES]
    argv += [*(["--revision", revision] if revision else []), *(["--cache-dir", cache_dir] if cache_dir else [])]
    blobs = Path(cache_dir or constants.HF_HUB_CACHE) / repo_folder_name(repo_id=model, repo_type="model") / "blobs"
    before = set(blobs.glob("*.incomplete"))
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    try:
        out, _ = child.communicate()
    except BaseException:  # Ctrl-C: the child ignores it; it is killed, not waited for
        child.kill()
        child.wait()
        for partial in set(blobs.glob("*.incomplete")) - before:
            partial.unlink(missing_ok=True)
        raise
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines:
        raise ModelUnavailable(f"downloading its weights failed: {lines[-1] if lines else child.returncode}")
    return Path(lines[-1])


def fetch_named(model: str, flags: Mapping[str, object], say: Callable[[str], object], source: str,
                key: str | None) -> None:
    """fetch() where needs_fetch(), its failure a one-line SpecError naming where the model was given."""
    if needs_fetch(model, flags):
        try:
            fetch(model, flags, say)
        except ModelUnavailable as e:
            raise SpecError(source, key, f"cannot fetch {model!r}: {e}") from None


def _download_main() -> None:
    """The child: snapshot_download of the files named, its progress bars on stderr; the folder (or the error's
    first line, exit 1) on stdout."""
    from huggingface_hub import snapshot_download

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tuner stops it (fetch)
    parser = argparse.ArgumentParser(prog="python -m autotune.engine.weights")
    parser.add_argument("model")
    parser.add_argument("patterns", nargs="+")
    parser.add_argument("--revision")
    parser.add_argument("--cache-dir")
    args = parser.parse_args()
    try:
        print(snapshot_download(args.model, revision=args.revision, cache_dir=args.cache_dir,
                                allow_patterns=args.patterns))
    except Exception as e:
        print(first_line(e))
        sys.exit(1)


if __name__ == "__main__":
    _download_main()
