"""What requests a load level sends: drawn token lengths, shared prefixes, multi-turn conversations, prompts
from a dataset, or a replayed request log (the file formats: measure/datasets.py).

Drawn prompts are token ids, so the input length is exact; with `ignore_eos` and `max_tokens` the output length
is exact too. Everything is derived from a seed, so two trials (or two levels of one trial) can be given the same
requests. `prompt = "text"` sends the same ids decoded with the model's tokenizer instead, and `api = "chat"` sends
them as chat messages, which the server renders with the model's chat template: the server then pays the
tokenization (and templating) that real traffic costs, and the input lengths are its count, from the usage it
reports.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np

from autotune.errors import SpecError
from autotune.measure.datasets import Prompt, read_dataset, read_request_log

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
    """One request: its prompt as token ids (the exact input length; a later turn's ids include the conversation
    before it) and an exact output length.

    `prompt_text`, when set, is what is sent instead of the ids: the whole prompt on /v1/completions, the last user
    message on /v1/chat/completions, after `history` (the earlier messages, user and assistant alternately).
    `turn_lens` splits the ids of a later turn into the earlier messages (chat sends them as `history`). Turns of
    one `conversation` are sent one after another; `at` (a replayed log) is when the request arrives, in
    seconds at a mean rate of one request per second (the client scales it to the level's rate)."""

    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    prompt_text: str | None = None
    history: tuple[str, ...] = ()
    turn_lens: tuple[int, ...] = ()
    conversation: int | None = None
    at: float | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


Tokenize = Callable[[str], list[int]]
Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Workload:
    """What a level sends. `api`: "completions" (/v1/completions) or "chat" (/v1/chat/completions, with the
    model's chat template; always text). `prompt`: on /v1/completions, the ids or the ids decoded to text.
    `dataset` (prompts from a file) or `replay` (a request log: its lengths, shared prefixes and arrival times)
    replace the drawn lengths; `turns` > 1 makes conversations whose every turn resends the ones before it."""

    input_len: LengthDist = LengthDist()
    output_len: LengthDist = LengthDist(mean=128)
    shared_prefix_len: int = 0  # tokens every prompt starts with (exercises prefix caching)
    dataset: Path | None = None  # JSONL or ShareGPT prompts (measure/datasets.py); overrides input_len
    seed: int = 0
    prompt: Literal["token_ids", "text"] = "token_ids"  # what is sent: the ids, or the ids decoded to text
    api: Literal["completions", "chat"] = "completions"
    replay: Path | None = None  # a request log (measure/datasets.py), replayed at each level's rate
    turns: int = 1  # turns per conversation: turn k resends turns 1..k-1 and their answers (a prefix to reuse)
    # Cut each prompt to the trial's max_model_len (less the answer, and the chat template's tokens): an agent
    # compacts its context to the window the server offers, so a longer context is sent longer prompts.
    clip_to_context: bool = False

    @property
    def sends_text(self) -> bool:
        """Whether requests carry text (the model's tokenizer is then needed), not token ids."""
        return self.prompt == "text" or self.api == "chat"

    def requests(
        self,
        n: int,
        vocab_size: int,
        *,
        seed_offset: int = 0,
        tokenize: Tokenize | None = None,
        decode: Decode | None = None,
        context: int | None = None,
    ) -> list[RequestSpec]:
        """`n` requests, the same for the same (seed, seed_offset); when the workload sends text, each carries its
        text: the dataset's own, else its ids decoded by `decode` (the model's tokenizer: prompt_decoder).
        `context`: the trial's max_model_len, which `clip_to_context` cuts each prompt to (None: not cut)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = np.random.default_rng([self.seed, seed_offset])
        if self.dataset is not None:
            specs = self._from_dataset(n, vocab_size, rng, tokenize)
        elif self.replay is not None:
            specs = self._from_log(n, vocab_size)
        elif self.turns > 1:
            specs = self._conversations(n, vocab_size, rng)
        else:
            specs = self._ids(n, vocab_size, rng)
        room = self.prompt_room(context)
        if not self.sends_text:
            return [_cut(s, room) for s in specs]
        if decode is None:
            raise ValueError("a workload that sends text needs the model's tokenizer to decode the prompts "
                             "(decode=None)")
        texts = [self._with_text(_cut(s, room), decode) for s in specs]
        return texts if room is None or tokenize is None else [_text_within(s, room, tokenize, decode) for s in texts]

    def prompt_room(self, context: int | None) -> int | None:
        """The most prompt tokens a request may carry in a `context` (max_model_len) of tokens where the workload
        clips to it: the longest answer drawn and, for chat, the template's tokens fit beside it. None where prompts
        are not cut."""
        if not self.clip_to_context or context is None:
            return None
        answer = self.output_len.max if self.output_len.kind != "fixed" else self.output_len.mean
        return max(1, context - answer - (CHAT_TEMPLATE_TOKENS if self.api == "chat" else 0))

    def mean_request_tokens(self, context: int | None = None) -> float:
        """A request's mean length in tokens (prompt and answer), its prompt cut to `context` where the workload
        clips to it: what a KV cache holds per request, for the load search's first level and the screen."""
        room = self.prompt_room(context)
        prompt = self.input_len.mean if room is None else min(self.input_len.mean, room)
        return prompt + self.output_len.mean

    def _with_text(self, spec: RequestSpec, decode: Decode) -> RequestSpec:
        if spec.prompt_text is not None:
            return spec
        if self.api != "chat" or not spec.turn_lens:
            return dataclasses.replace(spec, prompt_text=decode(spec.prompt_token_ids))
        messages, pos = [], 0  # the earlier turns travel as messages, the last user message as the prompt
        for k in (*spec.turn_lens, len(spec.prompt_token_ids) - sum(spec.turn_lens)):
            messages.append(decode(spec.prompt_token_ids[pos : pos + k]))
            pos += k
        return dataclasses.replace(spec, prompt_text=messages[-1], history=tuple(messages[:-1]))

    def _draw(self, rng: np.random.Generator, n: int, vocab_size: int) -> list[tuple[int, ...]]:
        """`n` prompts of random ids, each starting with the shared prefix (which depends on `seed` only, so every
        level and the warm-up share it).

        `vocab_size` bounds random ids (exclusive): pass the number of ordinary tokens, so that special
        tokens kept above it are never sent."""
        if vocab_size <= IDS_LOW:
            raise ValueError(f"vocab_size must be > {IDS_LOW}, got {vocab_size}")
        head = _random_ids([self.seed, 1 << 31], self.shared_prefix_len, vocab_size)
        in_lens = np.maximum(self.input_len.sample(rng, n), self.shared_prefix_len)
        body = rng.integers(IDS_LOW, vocab_size, int(in_lens.sum() - n * self.shared_prefix_len)).tolist()
        out, pos = [], 0
        for in_len in in_lens.tolist():
            k = in_len - self.shared_prefix_len
            out.append(head + tuple(body[pos : pos + k]))
            pos += k
        return out

    def _ids(self, n: int, vocab_size: int, rng: np.random.Generator) -> list[RequestSpec]:
        prompts = self._draw(rng, n, vocab_size)
        return [RequestSpec(p, out) for p, out in zip(prompts, self.output_len.sample(rng, n).tolist(), strict=True)]

    def _conversations(self, n: int, vocab_size: int, rng: np.random.Generator) -> list[RequestSpec]:
        """Conversations of `turns` turns, in order. A turn's prompt is every earlier message (user turns and drawn
        answers of the drawn output lengths: a real client resends the answer it got, which random weights make
        meaningless) and a new user message; the earlier prompt is then a prefix the server may have cached."""
        users = self._draw(rng, n, vocab_size)
        outs = self.output_len.sample(rng, n).tolist()
        answers = [tuple(rng.integers(IDS_LOW, vocab_size, k).tolist()) for k in outs]
        specs: list[RequestSpec] = []
        history: tuple[tuple[int, ...], ...] = ()
        for i in range(n):
            turn = i % self.turns
            if turn == 0:
                history = ()
            ids = tuple(t for h in history for t in h) + users[i]
            specs.append(RequestSpec(ids, outs[i], turn_lens=tuple(len(h) for h in history),
                                     conversation=i // self.turns))
            history = (*history, users[i], answers[i])
        return specs

    def arrival_seed(self, seed_offset: int) -> tuple[int, int, int]:
        """The seed of the rate mode's arrival schedule (load.arrival_times) at the level with `seed_offset`:
        each level of a trial gets its own draw, and two trials get the same traffic at the same level, as they
        get the same requests. Its own stream (the trailing 1), so arrivals do not echo the request lengths."""
        return (self.seed, seed_offset, 1)

    def _from_dataset(self, n: int, vocab_size: int, rng: np.random.Generator,
                      tokenize: Tokenize | None) -> list[RequestSpec]:
        """Entries drawn in a seeded random order, cycling through the file when `n` exceeds it."""
        assert self.dataset is not None
        rows = read_dataset(self.dataset)
        default_out = self.output_len.sample(rng, n).tolist()
        order: list[int] = []
        while len(order) < n:
            order.extend(rng.permutation(len(rows)).tolist())
        specs = []
        for i, j in enumerate(order[:n]):
            ids, out = prompt_ids(rows[j], str(self.dataset), vocab_size, tokenize)
            text = rows[j].text if self.sends_text else None
            specs.append(RequestSpec(ids, out if out is not None else default_out[i], text))
        return specs

    def _from_log(self, n: int, vocab_size: int) -> list[RequestSpec]:
        """The log's requests in order (every level replays it from its first line, cycling when `n` exceeds it),
        with arrival times stretched to a mean rate of one request per second; named prefixes are random ids drawn
        once per name, so requests that shared a prefix share one here."""
        assert self.replay is not None
        log = read_request_log(self.replay)
        first, span = log[0].timestamp, log[-1].timestamp - log[0].timestamp
        per_second = (len(log) - 1) / span  # the log's own mean rate
        specs = []
        for i in range(n):
            row, cycle = log[i % len(log)], i // len(log)
            prefix = _random_ids([self.seed, zlib.crc32(row.prefix.encode())], row.prefix_len, vocab_size) \
                if row.prefix is not None else ()
            body = _random_ids([self.seed, i, 2], row.input_len - len(prefix), vocab_size)
            at = (row.timestamp - first) * per_second + cycle * len(log)  # the next pass follows one mean gap later
            specs.append(RequestSpec(prefix + body, row.output_len, at=at))
        return specs


# Tokens a chat template wraps a user message in (Qwen's: "<|im_start|>user\n", "<|im_end|>\n", the assistant's
# turn and an empty think block; others' system lines), with room to spare.
CHAT_TEMPLATE_TOKENS = 64


def _cut(spec: RequestSpec, room: int | None) -> RequestSpec:
    """The request with its prompt cut to `room` tokens (the shared prefix comes first, so it is kept)."""
    if room is None or spec.prompt_len <= room:
        return spec
    return dataclasses.replace(spec, prompt_token_ids=spec.prompt_token_ids[:room])


def _text_within(spec: RequestSpec, room: int, tokenize: Tokenize, decode: Decode) -> RequestSpec:
    """A text prompt cut until the server's count of it fits `room`: random ids decoded and read back by the
    tokenizer may come to a few more tokens than were drawn."""
    ids, text = spec.prompt_token_ids, spec.prompt_text or ""
    while (count := len(tokenize(text))) > room:
        ids = ids[: min(len(ids) - 1, len(ids) * room // count)]  # in proportion: the tokens per id stay alike
        text = decode(ids)
    return dataclasses.replace(spec, prompt_token_ids=ids, prompt_text=text)


def _random_ids(seed: list[int], n: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(np.random.default_rng(seed).integers(IDS_LOW, vocab_size, n).tolist())


def prompt_ids(row: Prompt, src: str, vocab_size: int, tokenize: Tokenize | None) -> tuple[tuple[int, ...], int | None]:
    """A dataset entry's prompt ids and output length (a ShareGPT answer's token count), checked against the
    vocabulary; SpecError names the file and the entry."""
    if row.token_ids is not None:
        ids = row.token_ids
    elif tokenize is None:
        raise SpecError(src, row.where, "a text 'prompt' needs the model's tokenizer (none was given)")
    else:
        ids = tuple(tokenize(row.text or ""))
        if not ids:
            raise SpecError(src, row.where, "the prompt tokenizes to no tokens")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise SpecError(src, row.where, f"token id {bad[0]} outside the vocabulary [0, {vocab_size})")
    out = row.output_len
    if out is None and row.answer is not None:
        if tokenize is None:
            raise SpecError(src, row.where, "a ShareGPT answer's length needs the model's tokenizer (none was given)")
        out = max(1, len(tokenize(row.answer)))
    return ids, out


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


@lru_cache(maxsize=8)
def prompt_encoder(model: str) -> Tokenize:
    """Text -> ids with the model's own tokenizer, as the server counts a prompt (no special tokens added)."""
    from tokenizers import Tokenizer

    path = tokenizer_file(model)
    if path is None:
        raise ValueError(f"no tokenizer.json for {model}")
    tokenizer = Tokenizer.from_file(str(path))
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def tokenizer_of(workload: Workload, model: str) -> tuple[Tokenize | None, Decode | None]:
    """The `tokenize` and `decode` arguments Workload.requests needs for `model`: none for token ids alone."""
    if workload.sends_text or workload.dataset is not None:
        return prompt_encoder(model), prompt_decoder(model)
    return None, None
