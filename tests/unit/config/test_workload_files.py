"""A workload's dataset or request log is read and checked when the objective loads: a bad line is one line naming
the file and the line, exit 2, before a server boots or the database is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.config.objective import load_objective
from autotune.errors import SpecError

ROOT = Path(__file__).resolve().parents[3]
QUICK = ROOT / "tests" / "data" / "quick"
GOOD = {"prompt_token_ids": [11, 12, 13], "output_len": 4}


def quick_with(tmp_path: Path, workload: str, load: str = 'mode = "concurrency"\nstart = 1\nmax = 4\n') -> Path:
    """The quick study, its objective's [workload] and [load] replaced."""
    for f in QUICK.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "quick-objective.toml").write_text(
        f'name = "quick"\n[workload]\n{workload}\n[limits]\np95_ttft_ms = 2000\n[load]\n{load}')
    return tmp_path / "quick.toml"


def refused(study: Path, named: str) -> None:
    """`autotune run` says one line naming `named`, exits 2, and writes nothing."""
    before = sorted(study.parent.iterdir())
    out = CliRunner().invoke(main, ["run", str(study), "--n-trials", "1"])
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert out.exit_code == 2 and len(lines) == 1 and named in lines[0], out.output
    assert sorted(study.parent.iterdir()) == before


def test_a_malformed_jsonl_line_is_refused_at_load_naming_the_file_and_line(tmp_path: Path) -> None:
    study = quick_with(tmp_path, 'dataset = "prompts.jsonl"\noutput_len = 8')
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps(GOOD) + "\n\n" + '{"prompt": "w11 w12", "output_len": 4\n')
    with pytest.raises(SpecError) as e:
        load_objective(tmp_path / "quick-objective.toml")
    assert (e.value.source, e.value.key) == (str(data), "line 3") and "not valid JSON" in e.value.message
    refused(study, f"{data}: line 3: not valid JSON")


def test_a_prompt_longer_than_the_models_positions_is_refused_before_anything_boots(tmp_path: Path) -> None:
    study = quick_with(tmp_path, 'dataset = "prompts.jsonl"\noutput_len = 8')
    data = tmp_path / "prompts.jsonl"
    # the tiny model has 8192 positions: 8190 prompt tokens and 4 out do not fit
    data.write_text(json.dumps(GOOD) + "\n" + json.dumps({"prompt": "w11 " * 8190, "output_len": 4}) + "\n")
    refused(study, f"{data}: line 2: 8,190 prompt tokens + 4 output tokens exceed the 8,192 positions")


def test_a_token_id_outside_the_models_vocabulary_is_refused_at_load(tmp_path: Path) -> None:
    study = quick_with(tmp_path, 'dataset = "prompts.jsonl"\noutput_len = 8')
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt_token_ids": [11, 4096]}) + "\n")
    refused(study, "line 1: token id 4096 outside the vocabulary [0, 4096)")


def test_a_bad_request_log_line_is_refused_at_load(tmp_path: Path) -> None:
    study = quick_with(tmp_path, 'replay = "log.jsonl"', 'mode = "rate"\nstart = 1\nmax = 4\n')
    log = tmp_path / "log.jsonl"
    log.write_text('{"timestamp": 0, "input_len": 8, "output_len": 2}\n{"timestamp": 1, "input_len": 8}\n')
    refused(study, f"{log}: line 2: 'output_len' is missing")


@pytest.mark.parametrize(("workload", "load", "named"), [
    ('replay = "log.jsonl"', 'mode = "concurrency"', 'load.mode: a replayed log needs mode = "rate"'),
    ('replay = "log.jsonl"\ndataset = "log.jsonl"', 'mode = "rate"', "workload.replay: give either 'dataset'"),
    ("turns = 0", 'mode = "rate"', "workload.turns: must be >= 1"),
    ('turns = 2\nreplay = "log.jsonl"', 'mode = "rate"', "workload.turns: conversations are drawn"),
    ('api = "chats"', 'mode = "rate"', "workload.api: must be one of 'completions', 'chat'"),
    ("turns = 2\nclip_to_context = true", 'mode = "concurrency"', "workload.clip_to_context: cuts drawn prompts"),
])
def test_workload_keys_that_cannot_go_together_are_refused(tmp_path: Path, workload: str, load: str,
                                                           named: str) -> None:
    study = quick_with(tmp_path, workload, load + "\nstart = 1\nmax = 4\n")
    (tmp_path / "log.jsonl").write_text('{"timestamp": 0, "input_len": 8, "output_len": 2}\n'
                                        '{"timestamp": 1, "input_len": 8, "output_len": 2}\n')
    refused(study, named)


def test_the_shipped_objectives_send_text_and_the_chat_one_chat_requests() -> None:
    objectives = {p.stem: load_objective(p) for p in (ROOT / "objectives").glob("*.toml")}
    assert objectives and all(o.workload.sends_text for o in objectives.values())
    assert objectives["chat-p95"].workload.api == "chat"


def test_the_long_context_objective_sends_long_chat_prompts_behind_a_shared_prefix_cut_to_the_context() -> None:
    agentic = load_objective(ROOT / "objectives" / "long-context-agentic.toml").workload
    assert agentic.api == "chat" and agentic.clip_to_context
    assert (agentic.input_len.min, agentic.input_len.max, agentic.shared_prefix_len) == (16_384, 120_000, 16_384)
    assert agentic.prompt_room(32_768) == 32_768 - 512 - 64  # a 32k trial is sent 32k prompts
    scaled = load_objective(ROOT / "tests" / "data" / "workloads" / "long-context-objective.toml").workload
    assert (scaled.api, scaled.clip_to_context, scaled.shared_prefix_len) == ("chat", True, 512)


def test_the_shipped_workload_files_load_and_fit_the_tiny_model() -> None:
    from autotune.config.workload_checks import check_prompt_tokenizer
    from autotune.measure.datasets import read_dataset, read_request_log

    data = ROOT / "tests" / "data" / "workloads"
    chat = load_objective(data / "chat-dataset-objective.toml")
    assert chat.workload.api == "chat" and chat.workload.dataset == data / "chat-prompts.jsonl"
    check_prompt_tokenizer(chat, ["tiny:dense"])
    assert len(read_dataset(data / "chat-prompts.jsonl")) == 32
    assert len(read_dataset(data / "sharegpt-sample.json")) == 8  # the entry without an answer is skipped
    replay = load_objective(data / "replay-objective.toml")
    log = read_request_log(data / "request-log.jsonl")
    assert replay.load.mode == "rate" and len(log) == 60 and {r.prefix for r in log} == {None, "support-bot",
                                                                                          "code-helper"}


def test_a_hub_models_tokenizer_is_fetched_or_its_absence_said_in_one_line(tmp_path: Path) -> None:
    """No hub here (and a made-up id anywhere): the tokenizer cannot come, which is said before anything boots."""
    from autotune.config.workload_checks import check_prompt_tokenizer

    objective = tmp_path / "o.toml"
    objective.write_text('[workload]\napi = "chat"\n[limits]\nttft_p95_ms = 10\n')
    with pytest.raises(SpecError) as e:
        check_prompt_tokenizer(load_objective(objective), ["nobody-xyz/no-such-model-4f1c"])
    assert (e.value.source, e.value.key) == (str(objective), "workload.prompt")
    assert "nobody-xyz/no-such-model-4f1c's tokenizer.json" in e.value.message
