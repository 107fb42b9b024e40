"""Prompt datasets and request logs, read and checked when the objective is loaded (a bad line is said in one
line naming the file and the line, before anything boots or is written).

A dataset (`[workload] dataset`) is one of two formats, told apart by its first character:

- JSONL prompts: one JSON object per line, `{"prompt": "text"}` or `{"prompt_token_ids": [1, 2, 3]}`, with an
  optional `"output_len": N` (else the workload's `output_len` applies). Blank lines are skipped.
- ShareGPT JSON (a file that begins with `[`): an array of `{"conversations": [{"from": "human", "value": "..."},
  {"from": "gpt", "value": "..."}, ...]}`. As `vllm bench serve --dataset-name sharegpt` reads it, each entry's
  first turn is the prompt and the second (the recorded answer) sets the output length: its token count under the
  model's tokenizer. Entries with fewer than two turns are skipped, as vLLM skips them.

A request log (`[workload] replay`) is JSONL, one request per line, in the order they arrived:
`{"timestamp": 12.5, "input_len": 812, "output_len": 140}`, with an optional shared prefix
`"prefix": "system-a", "prefix_len": 600` (requests naming the same prefix begin with the same `prefix_len` tokens,
which is where prefix caching decides). Timestamps are seconds (any origin: Unix time or from the first request)
and must not decrease; prompts are not needed, only their lengths, so a log holds nothing private.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from autotune.errors import SpecError


@dataclass(frozen=True)
class Prompt:
    """One dataset entry: text or token ids, and an output length if the file gives one."""

    where: str  # "line 3" or "entry 3": how an error found later (a token length) names it
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    output_len: int | None = None
    answer: str | None = None  # ShareGPT: the recorded answer, whose token count is the output length


@dataclass(frozen=True)
class LoggedRequest:
    """One line of a request log."""

    where: str
    timestamp: float
    input_len: int
    output_len: int
    prefix: str | None = None
    prefix_len: int = 0


def read_dataset(path: Path) -> tuple[Prompt, ...]:
    """The prompts of a JSONL or ShareGPT JSON file; SpecError names the file and the line or entry."""
    text = _read(path, "dataset")
    rows = _sharegpt(text, str(path)) if text.lstrip().startswith("[") else _jsonl_prompts(text, str(path))
    if not rows:
        raise SpecError(str(path), None, "dataset has no prompts")
    return rows


def read_request_log(path: Path) -> tuple[LoggedRequest, ...]:
    """The requests of a log, checked: lengths, timestamps that do not go back, one length per named prefix."""
    src = str(path)
    rows = tuple(_logged(obj, src, where) for where, obj in _json_lines(_read(path, "request log"), src))
    if len(rows) < 2:
        raise SpecError(src, None, "a request log needs at least two requests (their spacing is its rate)")
    prefix_lens: dict[str, int] = {}
    for before, row in zip(rows, rows[1:], strict=False):
        if row.timestamp < before.timestamp:
            raise SpecError(src, row.where, f"timestamp {row.timestamp:g} is before the previous line's "
                                            f"({before.timestamp:g}): list requests in the order they arrived")
    for row in rows:
        if row.prefix is not None and prefix_lens.setdefault(row.prefix, row.prefix_len) != row.prefix_len:
            raise SpecError(src, row.where, f"prefix {row.prefix!r} has prefix_len {row.prefix_len} here and "
                                            f"{prefix_lens[row.prefix]} on an earlier line")
    if rows[-1].timestamp == rows[0].timestamp:
        raise SpecError(src, None, "every request has the same timestamp: a log needs a time span to give a rate")
    return rows


def _read(path: Path, what: str) -> str:
    try:
        return _read_cached(str(path), *_stamp(path))
    except OSError as e:
        raise SpecError(str(path), None, f"cannot read {what}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise SpecError(str(path), None, f"{what} is not UTF-8 text") from e


def _stamp(path: Path) -> tuple[int, int]:
    st = Path(path).stat()
    return st.st_mtime_ns, st.st_size


@lru_cache(maxsize=4)
def _read_cached(path: str, _mtime_ns: int, _size: int) -> str:
    """A file read once per version: the objective's check and every level's requests read the same text."""
    return Path(path).read_text(encoding="utf-8-sig")


def _json_lines(text: str, src: str) -> list[tuple[str, dict]]:
    """(where, object) for each non-blank line."""
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError(src, where, f"not valid JSON ({e.msg})") from e
        if not isinstance(obj, dict):
            raise SpecError(src, where, "expected a JSON object")
        out.append((where, obj))
    return out


def _jsonl_prompts(text: str, src: str) -> tuple[Prompt, ...]:
    return tuple(_prompt(obj, src, where) for where, obj in _json_lines(text, src))


def _prompt(obj: dict, src: str, where: str) -> Prompt:
    unknown = set(obj) - {"prompt_token_ids", "prompt", "output_len"}
    if unknown:
        raise SpecError(src, where, f"unknown keys {sorted(unknown)}")
    if ("prompt_token_ids" in obj) == ("prompt" in obj):
        raise SpecError(src, where, "give exactly one of 'prompt_token_ids' and 'prompt'")
    output_len = obj.get("output_len")
    if output_len is not None:
        output_len = _count(obj, "output_len", src, where)
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise SpecError(src, where, "'prompt' must be a non-empty string")
        return Prompt(where, text=obj["prompt"], output_len=output_len)
    ids = obj["prompt_token_ids"]
    if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
        raise SpecError(src, where, "'prompt_token_ids' must be a non-empty list of non-negative integers")
    return Prompt(where, token_ids=tuple(ids), output_len=output_len)


def _sharegpt(text: str, src: str) -> tuple[Prompt, ...]:
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(src, f"line {e.lineno}", f"not valid JSON ({e.msg})") from e
    if not isinstance(entries, list):
        raise SpecError(src, None, "a ShareGPT dataset is a JSON array of {\"conversations\": [...]}")
    rows = []
    for i, entry in enumerate(entries):
        where = f"entry {i}"
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            raise SpecError(src, where, "expected an object with a 'conversations' list")
        values = [t.get("value") if isinstance(t, dict) else None for t in turns]
        texts = [v for v in values if isinstance(v, str)]
        if len(texts) < len(values):
            raise SpecError(src, where, "each turn must be an object with a string 'value'")
        if len(texts) >= 2 and texts[0].strip() and texts[1].strip():  # vLLM's reader skips the others too
            rows.append(Prompt(where, text=texts[0], answer=texts[1]))
    return tuple(rows)


def _logged(obj: dict, src: str, where: str) -> LoggedRequest:
    unknown = set(obj) - {"timestamp", "input_len", "output_len", "prefix", "prefix_len"}
    if unknown:
        raise SpecError(src, where, f"unknown keys {sorted(unknown)}")
    for key in ("timestamp", "input_len", "output_len"):
        if key not in obj:
            raise SpecError(src, where, f"'{key}' is missing")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise SpecError(src, where, f"'timestamp' must be a finite number of seconds, got {ts!r}")
    input_len, output_len = _count(obj, "input_len", src, where), _count(obj, "output_len", src, where)
    prefix = obj.get("prefix")
    if ("prefix" in obj) != ("prefix_len" in obj):
        raise SpecError(src, where, "give 'prefix' and 'prefix_len' together")
    if prefix is None:
        return LoggedRequest(where, float(ts), input_len, output_len)
    if not isinstance(prefix, str) or not prefix:
        raise SpecError(src, where, f"'prefix' must be a non-empty string (a name), got {prefix!r}")
    prefix_len = _count(obj, "prefix_len", src, where)
    if prefix_len > input_len:
        raise SpecError(src, where, f"'prefix_len' ({prefix_len}) is longer than 'input_len' ({input_len})")
    return LoggedRequest(where, float(ts), input_len, output_len, prefix, prefix_len)


def _count(obj: dict, key: str, src: str, where: str) -> int:
    v = obj[key]
    if type(v) is not int or v < 1:
        raise SpecError(src, where, f"'{key}' must be a positive integer, got {v!r}")
    return v
