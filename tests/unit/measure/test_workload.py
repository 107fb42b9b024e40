"""Requests from a workload: determinism, exact lengths, the shared prefix, and dataset files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autotune.errors import SpecError
from autotune.measure.workload import IDS_LOW, LengthDist, Workload

VOCAB = 4096


def test_fixed_lengths_are_exact():
    reqs = Workload(LengthDist(mean=256), LengthDist(mean=128)).requests(20, VOCAB)
    assert len(reqs) == 20
    assert {r.prompt_len for r in reqs} == {256} and {r.max_tokens for r in reqs} == {128}
    ids = np.array([r.prompt_token_ids for r in reqs])
    assert ids.min() >= IDS_LOW and ids.max() < VOCAB
    assert len({r.prompt_token_ids for r in reqs}) == 20  # distinct prompts: no accidental prefix caching


def test_same_seed_and_offset_give_the_same_requests():
    w = Workload(LengthDist("normal", 200, 50, 10, 400), LengthDist("uniform", 64, 20, 1, 128), seed=7)
    assert w.requests(30, VOCAB, seed_offset=3) == w.requests(30, VOCAB, seed_offset=3)
    assert w.requests(30, VOCAB, seed_offset=3) != w.requests(30, VOCAB, seed_offset=4)
    assert w.requests(30, VOCAB) != Workload(w.input_len, w.output_len, seed=8).requests(30, VOCAB)


@pytest.mark.parametrize("kind", ["uniform", "normal", "lognormal"])
def test_distributions_have_their_mean_and_stay_in_bounds(kind):
    d = LengthDist(kind, mean=500, std=100, min=1, max=10_000)
    x = d.sample(np.random.default_rng(0), 200_000)
    assert x.dtype.kind == "i"
    assert abs(x.mean() - 500) < 2 and abs(x.std() - 100) < 2
    clipped = LengthDist(kind, mean=500, std=300, min=400, max=600).sample(np.random.default_rng(0), 10_000)
    assert clipped.min() == 400 and clipped.max() == 600


def test_uniform_spans_mean_plus_minus_sqrt3_std():
    x = LengthDist("uniform", mean=100, std=10).sample(np.random.default_rng(1), 100_000)
    assert x.min() == 83 and x.max() == 117  # 100 -+ 17.32, rounded


def test_fixed_ignores_std():
    assert LengthDist("fixed", 7, 3.0).sample(np.random.default_rng(0), 3).tolist() == [7, 7, 7]


def test_shared_prefix_is_counted_in_input_len_and_shared_across_levels():
    w = Workload(LengthDist(mean=100), shared_prefix_len=60, seed=3)
    a, b = w.requests(10, VOCAB), w.requests(10, VOCAB, seed_offset=1)
    prefix = a[0].prompt_token_ids[:60]
    assert all(r.prompt_len == 100 and r.prompt_token_ids[:60] == prefix for r in a + b)
    assert len({r.prompt_token_ids[60:] for r in a + b}) == 20
    # a prompt shorter than the prefix is lengthened to the prefix
    short = Workload(LengthDist("uniform", 50, 30, 1, 100), shared_prefix_len=40).requests(50, VOCAB)
    assert min(r.prompt_len for r in short) == 40


def write(tmp_path, lines):
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return p


def test_dataset_of_token_ids_and_text(tmp_path):
    p = write(tmp_path, [{"prompt_token_ids": [11, 12, 13], "output_len": 5}, "", {"prompt": "a b", "output_len": 2},
                         {"prompt_token_ids": [20]}])
    w = Workload(output_len=LengthDist(mean=9), dataset=p, seed=1)
    reqs = w.requests(7, VOCAB, tokenize=lambda s: [100 + len(t) for t in s.split()])
    rows = {((11, 12, 13), 5), ((101, 101), 2), ((20,), 9)}  # no output_len: the workload's distribution
    assert {(r.prompt_token_ids, r.max_tokens) for r in reqs} == rows
    assert sorted(r.prompt_token_ids for r in reqs[:3]) == sorted(x[0] for x in rows)  # each once per pass
    assert reqs == w.requests(7, VOCAB, tokenize=lambda s: [100 + len(t) for t in s.split()])


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({"prompt_token_ids": []}, "non-empty list of non-negative integers"),
        ({"prompt_token_ids": [1, "2"]}, "non-empty list of non-negative integers"),
        ({"prompt_token_ids": [1, 5000]}, "token id 5000 outside"),
        ({"prompt_token_ids": [1], "output_len": 0}, "'output_len' must be a positive integer"),
        ({"prompt_token_ids": [1], "prompt": "x"}, "exactly one of"),
        ({"prompt": "hello"}, "needs the model's tokenizer"),
        ({"prompt_token_ids": [1], "max_tokens": 3}, "unknown keys"),
    ],
)
def test_bad_dataset_line_names_file_and_line(tmp_path, line, message):
    p = write(tmp_path, [{"prompt_token_ids": [1, 2]}, line])
    with pytest.raises(SpecError) as e:
        Workload(dataset=p).requests(2, VOCAB)  # each line once
    assert e.value.source == str(p) and e.value.key == "line 2"
    assert message in str(e.value) and str(p) in str(e.value)


def test_missing_or_empty_dataset(tmp_path):
    with pytest.raises(SpecError, match="cannot read dataset"):
        Workload(dataset=tmp_path / "nope.jsonl").requests(1, VOCAB)
    with pytest.raises(SpecError, match="no prompts"):
        Workload(dataset=write(tmp_path, ["", "  "])).requests(1, VOCAB)


def test_length_dist_check_names_key():
    LengthDist(mean=10).check("obj.toml", "workload.input_len")
    with pytest.raises(SpecError, match="obj.toml: workload.input_len: need 1 <= min <= max"):
        LengthDist(min=10, max=5).check("obj.toml", "workload.input_len")


def test_text_prompts_are_the_same_ids_decoded_with_the_models_tokenizer(tmp_path) -> None:
    """The tiny model's real tokenizer (tokenizers' WordLevel): the text re-encodes to exactly the ids drawn."""
    from tokenizers import Tokenizer

    from autotune.engine.models import VOCAB_SIZE, write_tiny_model
    from autotune.measure.workload import prompt_decoder

    model = write_tiny_model("dense", tmp_path / "dense")
    ids_only = Workload(LengthDist(mean=32), LengthDist(mean=8), seed=3)
    text = Workload(LengthDist(mean=32), LengthDist(mean=8), seed=3, prompt="text")
    decode = prompt_decoder(str(model))
    sent = text.requests(5, VOCAB_SIZE, seed_offset=2, decode=decode)
    assert [r.prompt_token_ids for r in sent] == [r.prompt_token_ids for r in ids_only.requests(5, VOCAB_SIZE,
                                                                                                 seed_offset=2)]
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    for r in sent:
        assert isinstance(r.prompt_text, str) and r.prompt_text.startswith(f"w{r.prompt_token_ids[0]} ")
        assert tuple(tokenizer.encode(r.prompt_text, add_special_tokens=False).ids) == r.prompt_token_ids
    assert all(r.prompt_text is None for r in ids_only.requests(5, VOCAB_SIZE, decode=decode))
    with pytest.raises(ValueError, match="tokenizer"):
        text.requests(1, VOCAB_SIZE)


def tiny_tokenizer(tmp_path):
    from autotune.engine.models import VOCAB_SIZE, write_tiny_model
    from autotune.measure.workload import prompt_decoder, prompt_encoder

    model = str(write_tiny_model("dense", tmp_path / "dense"))
    return VOCAB_SIZE, prompt_encoder(model), prompt_decoder(model)


def test_a_sharegpt_file_gives_the_first_turn_as_prompt_and_the_answers_length_as_output(tmp_path) -> None:
    vocab, tokenize, decode = tiny_tokenizer(tmp_path)
    entries = [
        {"id": "a", "conversations": [{"from": "human", "value": "w11 w12 w13"}, {"from": "gpt", "value": "w20 w21"},
                                      {"from": "human", "value": "w30"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "w40"}]},  # no answer: skipped, as vLLM skips it
        {"id": "c", "conversations": [{"from": "human", "value": "w50 w51"}, {"from": "gpt", "value": "w1 w2 w3 w4"}]},
    ]
    p = tmp_path / "sharegpt.json"
    p.write_text(json.dumps(entries, indent=1))
    reqs = Workload(dataset=p, prompt="text").requests(4, vocab, tokenize=tokenize, decode=decode)
    got = {(r.prompt_text, r.prompt_token_ids, r.max_tokens) for r in reqs}
    assert got == {("w11 w12 w13", (11, 12, 13), 2), ("w50 w51", (50, 51), 4)}
    # token ids alone: the text is tokenized, not sent
    assert all(r.prompt_text is None for r in Workload(dataset=p).requests(2, vocab, tokenize=tokenize))


@pytest.mark.parametrize("text, where, message", [
    ('[{"conversations": [{"from": "human", "value": "a"}]},\n  {"conversations": [}]', "line 2", "not valid JSON"),
    ('[{"conversations": "hi"}]', "entry 0", "'conversations' list"),
    ('[{"conversations": []}, {"conversations": [{"from": "human", "value": 3}]}]', "entry 1", "string 'value'"),
    ('{"prompt": "x"}\n[1]', "line 2", "expected a JSON object"),
])
def test_a_bad_sharegpt_file_names_the_line_or_entry(tmp_path, text, where, message) -> None:
    from autotune.measure.datasets import read_dataset

    p = tmp_path / "data.json"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        read_dataset(p)
    assert (e.value.source, e.value.key) == (str(p), where) and message in e.value.message


def test_conversations_resend_every_earlier_turn_and_chat_splits_them_into_messages(tmp_path) -> None:
    vocab, _, decode = tiny_tokenizer(tmp_path)
    plain = Workload(LengthDist(mean=6), LengthDist(mean=3), turns=3, seed=5).requests(7, vocab)
    assert [r.conversation for r in plain] == [0, 0, 0, 1, 1, 1, 2]
    for before, turn in zip(plain, plain[1:], strict=False):
        if turn.conversation == before.conversation:  # the earlier prompt, its answer (3 ids), then 6 new ids
            assert turn.prompt_token_ids[: before.prompt_len] == before.prompt_token_ids
            assert turn.prompt_len == before.prompt_len + 3 + 6
    assert [r.prompt_len for r in plain[:3]] == [6, 15, 24]
    chat = Workload(LengthDist(mean=6), LengthDist(mean=3), turns=3, seed=5, api="chat").requests(7, vocab,
                                                                                                  decode=decode)
    third = chat[2]
    assert [len(m.split()) for m in third.history] == [6, 3, 6, 3] and len(third.prompt_text.split()) == 6
    assert " ".join([*third.history, third.prompt_text]) == decode(plain[2].prompt_token_ids)
    assert chat[0].history == () and chat[0].prompt_text == decode(plain[0].prompt_token_ids)


def write_log(tmp_path, lines) -> Path:
    p = tmp_path / "requests.jsonl"
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return p


def test_a_replayed_log_keeps_its_order_lengths_shared_prefixes_and_relative_arrivals(tmp_path) -> None:
    log = write_log(tmp_path, [
        {"timestamp": 1700000000.0, "input_len": 30, "output_len": 5, "prefix": "sys", "prefix_len": 20},
        {"timestamp": 1700000000.5, "input_len": 12, "output_len": 7},
        "",
        {"timestamp": 1700000004.0, "input_len": 25, "output_len": 2, "prefix": "sys", "prefix_len": 20},
    ])
    reqs = Workload(replay=log, seed=2).requests(5, VOCAB)
    assert [(r.prompt_len, r.max_tokens) for r in reqs] == [(30, 5), (12, 7), (25, 2), (30, 5), (12, 7)]
    # 2 gaps over 4 s: a mean rate of 0.5 request/s, stretched to 1/s; the second pass follows one mean gap later
    assert [r.at for r in reqs] == [0.0, 0.25, 2.0, 3.0, 3.25]
    assert reqs[0].prompt_token_ids[:20] == reqs[2].prompt_token_ids[:20] == reqs[3].prompt_token_ids[:20]
    assert reqs[0].prompt_token_ids[20:] != reqs[3].prompt_token_ids[20:]  # only the named prefix is shared
    assert reqs == Workload(replay=log, seed=2).requests(5, VOCAB)


@pytest.mark.parametrize("line, message", [
    ("{oops", "not valid JSON"),
    ({"timestamp": 3, "input_len": 10}, "'output_len' is missing"),
    ({"timestamp": "noon", "input_len": 10, "output_len": 2}, "'timestamp' must be a finite number"),
    ({"timestamp": 3, "input_len": 0, "output_len": 2}, "'input_len' must be a positive integer"),
    ({"timestamp": 1, "input_len": 10, "output_len": 2}, "is before the previous line's"),
    ({"timestamp": 3, "input_len": 10, "output_len": 2, "prefix": "p"}, "'prefix' and 'prefix_len' together"),
    ({"timestamp": 3, "input_len": 10, "output_len": 2, "prefix": "p", "prefix_len": 11}, "longer than 'input_len'"),
    ({"timestamp": 3, "input_len": 10, "output_len": 2, "prefix": "s", "prefix_len": 4}, "has prefix_len 4 here"),
    ({"timestamp": 3, "input_len": 10, "output_len": 2, "prompt": "hi"}, "unknown keys ['prompt']"),
])
def test_a_bad_request_log_line_is_named(tmp_path, line, message) -> None:
    from autotune.measure.datasets import read_request_log

    log = write_log(tmp_path, [{"timestamp": 2, "input_len": 10, "output_len": 2, "prefix": "s", "prefix_len": 5},
                               line, {"timestamp": 9, "input_len": 10, "output_len": 2}])
    with pytest.raises(SpecError) as e:
        read_request_log(log)
    assert (e.value.source, e.value.key) == (str(log), "line 2") and message in e.value.message


def test_a_request_log_needs_a_time_span(tmp_path) -> None:
    from autotune.measure.datasets import read_request_log

    with pytest.raises(SpecError, match="at least two requests"):
        read_request_log(write_log(tmp_path, [{"timestamp": 2, "input_len": 10, "output_len": 2}]))
    with pytest.raises(SpecError, match="same timestamp"):
        read_request_log(write_log(tmp_path, [{"timestamp": 2, "input_len": 10, "output_len": 2}] * 2))


LONG = Workload(LengthDist("lognormal", mean=1400, std=800, min=512, max=3600), LengthDist(mean=16),
                shared_prefix_len=512, clip_to_context=True)


def test_prompts_clipped_to_the_context_keep_the_shared_prefix_and_the_rest_of_the_draw() -> None:
    whole = LONG.requests(40, VOCAB)
    cut = LONG.requests(40, VOCAB, context=1024)
    assert max(r.prompt_len for r in whole) > 1024 > min(r.prompt_len for r in whole)  # some are cut, some not
    for w, c in zip(whole, cut, strict=True):
        assert c.prompt_len == min(w.prompt_len, 1024 - 16)  # the answer fits beside it
        assert c.prompt_token_ids == w.prompt_token_ids[: c.prompt_len] and c.max_tokens == w.max_tokens
    assert {r.prompt_token_ids[:512] for r in cut} == {whole[0].prompt_token_ids[:512]}
    unclipped = Workload(LONG.input_len, LONG.output_len, shared_prefix_len=512)
    assert unclipped.requests(40, VOCAB, context=1024) == whole  # only an objective that asks for it is cut


def test_a_chat_prompt_leaves_room_for_the_template_and_the_longest_answer() -> None:
    chat = Workload(LONG.input_len, LengthDist("normal", mean=16, std=4, min=8, max=32), shared_prefix_len=512,
                    api="chat", clip_to_context=True)
    assert chat.prompt_room(2048) == 2048 - 32 - 64
    assert chat.prompt_room(None) is None and Workload().prompt_room(2048) is None
    assert chat.mean_request_tokens(1024) == 1024 - 32 - 64 + 16
    assert chat.mean_request_tokens(262_144) == chat.mean_request_tokens() == 1400 + 16


def test_a_text_prompt_is_cut_until_the_tokenizer_counts_it_within_the_context(tmp_path) -> None:
    """Random ids decoded to text may read back as more tokens than were drawn (a BPE merges and splits across the
    joins): the cut goes by the tokenizer's count. Here every id above 2,000 reads back as two tokens."""
    from autotune.engine.models import VOCAB_SIZE, write_tiny_model
    from autotune.measure.workload import prompt_decoder, prompt_encoder

    model = str(write_tiny_model("dense", tmp_path / "dense"))
    encode, decode = prompt_encoder(model), prompt_decoder(model)

    def tokenize(text: str) -> list[int]:
        return [t for i in encode(text) for t in ((i, i) if i > 2000 else (i,))]

    text = Workload(LONG.input_len, LONG.output_len, shared_prefix_len=512, prompt="text", clip_to_context=True)
    sent = text.requests(20, VOCAB_SIZE, tokenize=tokenize, decode=decode, context=1024)
    assert all(len(tokenize(r.prompt_text or "")) <= 1024 - 16 for r in sent)
    assert max(len(tokenize(r.prompt_text or "")) for r in sent) > 0.98 * (1024 - 16)  # not much further than needed
    assert all(decode(r.prompt_token_ids) == r.prompt_text for r in sent)
