"""What requests a load level sends: exact token lengths, shared prefixes, or prompts from a file.

Prompts are token ids, not text, so the input length is exact and the client needs no tokenizer; with
`ignore_eos` and `max_tokens` the output length is exact too. Everything is derived from a seed, so two
trials (or two levels of one trial) can be given the same requests. `prompt = "text"` sends the same ids
decoded with the model's tokenizer instead, so the server pays the tokenization that text traffic costs
(its input lengths are then the server's count, from the usage it reports).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np

from autotune.errors import SpecError

# Random prompt ids start here: low ids are where tokenizers usually keep special and control tokens.
IDS_LOW = 10


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution. `fixed` uses `mean`; the others are clipped to [min, max].

    `mean` and `std` mean what they say for every kind: `uniform` spans mean +- sqrt(3) std, and
    `lognormal` is parametrised so the samples (before clipping) have that mean and std.
    """

    kind: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    mean: int = 256
    std: float = 0.0
    min: int = 1
    max: int = 1 << 20

    def check(self, source: str, key: str) -> None:
        """Raise SpecError (naming `source` and `key`) if these numbers cannot describe lengths."""
        if self.kind not in ("fixed", "uniform", "normal", "lognormal"):
            raise SpecError(source, f"{key}.kind", f"unknown kind {self.kind!r}")
        if self.mean < 1:
            raise SpecError(source, f"{key}.mean", f"must be >= 1, got {self.mean}")
        if self.std < 0:
            raise SpecError(source, f"{key}.std", f"must be >= 0, got {self.std}")
        if not 1 <= self.min <= self.max:
            raise SpecError(source, key, f"need 1 <= min <= max, got min={self.min} max={self.max}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` integer lengths (int64) drawn from `rng`."""
        if self.kind == "fixed" or self.std == 0:
            return np.full(n, self.mean, dtype=np.int64)
        if self.kind == "uniform":
            half = math.sqrt(3.0) * self.std
            x = rng.uniform(self.mean - half, self.mean + half, n)
        elif self.kind == "normal":
            x = rng.normal(self.mean, self.std, n)
        elif self.kind == "lognormal":
            sigma2 = math.log1p((self.std / self.mean) ** 2)
            x = rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), n)
        else:
            raise ValueError(f"unknown length distribution {self.kind!r}")
        return np.clip(np.rint(x), self.min, self.max).astype(np.int64)


@dataclass(frozen=True)
class RequestSpec:
    """One request: prompt token ids (exact input length) and an exact output length; `prompt_text`, when
    set, is what is sent instead of the ids (those ids decoded: a text-prompt workload)."""

    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    prompt_text: str | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class Workload:
    input_len: LengthDist = LengthDist()
    output_len: LengthDist = LengthDist(mean=128)
    shared_prefix_len: int = 0  # tokens every prompt starts with (exercises prefix caching)
    dataset: Path | None = None  # JSONL prompts; overrides input_len (and output_len where a line gives it)
    seed: int = 0
    prompt: Literal["token_ids", "text"] = "token_ids"  # what is sent: the ids, or the ids decoded to text

    def requests(
        self,
        n: int,
        vocab_size: int,
        *,
        seed_offset: int = 0,
        tokenize: Callable[[str], list[int]] | None = None,
        decode: Callable[[Sequence[int]], str] | None = None,
    ) -> list[RequestSpec]:
        """`n` requests, the same for the same (seed, seed_offset); with `prompt = "text"`, each carries its ids
        decoded by `decode` (the model's tokenizer: prompt_decoder) as the text to send."""
        specs = self._ids(n, vocab_size, seed_offset, tokenize)
        if self.prompt == "token_ids":
            return specs
        if decode is None:
            raise ValueError('prompt = "text" needs the model\'s tokenizer to decode the prompts (decode=None)')
        return [RequestSpec(s.prompt_token_ids, s.max_tokens, decode(s.prompt_token_ids)) for s in specs]

    def _ids(
        self, n: int, vocab_size: int, seed_offset: int, tokenize: Callable[[str], list[int]] | None
    ) -> list[RequestSpec]:
        """`n` requests as token ids, the same for the same (seed, seed_offset).

        `vocab_size` bounds random ids (exclusive): pass the number of ordinary tokens, so that special
        tokens kept above it are never sent. The shared prefix depends on `seed` only, so every level and
        the warm-up share it. `tokenize` turns dataset lines with a text `prompt` into ids.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = np.random.default_rng([self.seed, seed_offset])
        if self.dataset is not None:
            return self._from_dataset(n, vocab_size, rng, tokenize)
        if vocab_size <= IDS_LOW:
            raise ValueError(f"vocab_size must be > {IDS_LOW}, got {vocab_size}")
        prefix = np.random.default_rng([self.seed, 1 << 31]).integers(
            IDS_LOW, vocab_size, self.shared_prefix_len
        )
        in_lens = np.maximum(self.input_len.sample(rng, n), self.shared_prefix_len)
        out_lens = self.output_len.sample(rng, n)
        body = rng.integers(IDS_LOW, vocab_size, int(in_lens.sum() - n * self.shared_prefix_len))
        out: list[RequestSpec] = []
        pos = 0
        head = prefix.tolist()
        for in_len, out_len in zip(in_lens.tolist(), out_lens.tolist(), strict=True):
            k = in_len - self.shared_prefix_len
            ids = head + body[pos : pos + k].tolist()
            pos += k
            out.append(RequestSpec(tuple(ids), out_len))
        return out

    def arrival_seed(self, seed_offset: int) -> tuple[int, int, int]:
        """The seed of the rate mode's arrival schedule (load.arrival_times) at the level with `seed_offset`:
        each level of a trial gets its own draw, and two trials get the same traffic at the same level, as they
        get the same requests. Its own stream (the trailing 1), so arrivals do not echo the request lengths."""
        return (self.seed, seed_offset, 1)

    def _from_dataset(
        self,
        n: int,
        vocab_size: int,
        rng: np.random.Generator,
        tokenize: Callable[[str], list[int]] | None,
    ) -> list[RequestSpec]:
        """Lines drawn in a seeded random order, cycling through the file when `n` exceeds it."""
        assert self.dataset is not None
        rows = load_dataset(self.dataset, vocab_size, tokenize)
        default_out = self.output_len.sample(rng, n).tolist()
        order: list[int] = []
        while len(order) < n:
            order.extend(rng.permutation(len(rows)).tolist())
        return [
            RequestSpec(prompt, out if out is not None else default_out[i])
            for i, (prompt, out) in enumerate(rows[j] for j in order[:n])
        ]


def load_dataset(
    path: Path, vocab_size: int, tokenize: Callable[[str], list[int]] | None = None
) -> list[tuple[tuple[int, ...], int | None]]:
    """Parse a JSONL prompt file into (prompt ids, output length or None); SpecError names file and line.

    Each non-blank line is {"prompt_token_ids": [...], "output_len": N} or {"prompt": "text", "output_len": N};
    `output_len` is optional (the workload's output length distribution then applies).
    """
    src = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(src, None, f"cannot read dataset: {e.strerror or e}") from e
    rows: list[tuple[tuple[int, ...], int | None]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            rows.append(_parse_line(line, src, f"line {lineno}", vocab_size, tokenize))
    if not rows:
        raise SpecError(src, None, "dataset has no prompts")
    return rows


def _parse_line(
    line: str, src: str, where: str, vocab_size: int, tokenize: Callable[[str], list[int]] | None
) -> tuple[tuple[int, ...], int | None]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise SpecError(src, where, f"not valid JSON ({e.msg})") from e
    if not isinstance(obj, dict):
        raise SpecError(src, where, "expected a JSON object")
    unknown = set(obj) - {"prompt_token_ids", "prompt", "output_len"}
    if unknown:
        raise SpecError(src, where, f"unknown keys {sorted(unknown)}")
    if ("prompt_token_ids" in obj) == ("prompt" in obj):
        raise SpecError(src, where, "give exactly one of 'prompt_token_ids' and 'prompt'")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise SpecError(src, where, "'prompt' must be a non-empty string")
        if tokenize is None:
            raise SpecError(src, where, "a text 'prompt' needs a tokenizer (none was given)")
        ids = list(tokenize(obj["prompt"]))
        if not ids:
            raise SpecError(src, where, "'prompt' tokenizes to no tokens")
    else:
        ids = obj["prompt_token_ids"]
        if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
            raise SpecError(src, where, "'prompt_token_ids' must be a non-empty list of integers")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise SpecError(src, where, f"token id {bad[0]} outside the vocabulary [0, {vocab_size})")
    out_len = obj.get("output_len")
    if out_len is not None and (type(out_len) is not int or out_len < 1):
        raise SpecError(src, where, f"'output_len' must be a positive integer, got {out_len!r}")
    return tuple(ids), out_len


def tokenizer_file(model: str) -> Path | None:
    """The model's tokenizer.json: in its directory, or for a hub id in the local hub cache (never fetched
    here: a missing one must be said before anything boots, not after a download)."""
    if Path(model).is_dir():
        path = Path(model) / "tokenizer.json"
        return path if path.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model, "tokenizer.json")
    except ValueError:  # not a repo id either
        return None
    return Path(cached) if isinstance(cached, str) else None


@lru_cache(maxsize=8)
def prompt_decoder(model: str) -> Callable[[Sequence[int]], str]:
    """Ids -> text with the model's own tokenizer (special tokens kept: the ids are what was drawn)."""
    from tokenizers import Tokenizer

    path = tokenizer_file(model)
    if path is None:
        raise ValueError(f"no tokenizer.json for {model}")
    tokenizer = Tokenizer.from_file(str(path))
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
