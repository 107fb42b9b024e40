"""Study and objective files: what loads, and what each kind of mistake is told."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config.objective import load_objective
from autotune.config.study_file import load_study
from autotune.config.toml import parse_duration
from autotune.errors import SpecError
from autotune.measure.stats import Limits

ROOT = Path(__file__).resolve().parents[3]
BAD = Path(__file__).resolve().parents[2] / "data" / "bad"

# (file, dotted key the error names, a fragment of its message)
BAD_FILES = [
    ("obj-unknown-limit.toml", "limits.p95_ttft", "unknown key; did you mean 'p95_ttft_ms'?"),
    ("obj-no-limits.toml", "limits", "set at least one limit"),
    ("obj-bad-kind.toml", "workload.input_len.kind", "must be one of 'fixed', 'uniform', 'normal', 'lognormal'"),
    ("obj-min-gt-max.toml", "workload.input_len.min", "min (600) must be <= max (100)"),
    ("obj-bad-syntax.toml", None, "invalid TOML"),
    ("obj-missing-dataset.toml", "workload.dataset", "file not found"),
    ("obj-load-max-lt-start.toml", "load.max", "must be >= start"),
    ("obj-bad-mode.toml", "load.mode", "did you mean 'rate'?"),
    ("obj-negative-limit.toml", "limits.p95_tpot_ms", "must be > 0"),
    ("obj-float-length.toml", "workload.input_len", "must be an integer or a table"),
    ("obj-bad-prompt.toml", "workload.prompt", "must be one of 'token_ids', 'text', got 'txt'; did you mean 'text'?"),
    ("obj-bad-maximize.toml", "maximize", "must be one of 'output_throughput', 'output_tokens_per_joule', got "
     "'output_tokens_per_jule'; did you mean 'output_tokens_per_joule'?"),
    ("study-int-string.toml", "space.max_num_seqs.low", "must be an integer, got 'abc'"),
    ("study-low-gt-high.toml", "space.max_num_seqs.low", "low (64) must be <= high (8)"),
    ("study-log-zero.toml", "space.max_num_batched_tokens.log", "log = true needs low > 0"),
    ("study-empty-choices.toml", "space.max_model_len.choices", "must be a non-empty list"),
    ("study-unknown-type.toml", "space.max_num_seqs.type", "unknown type 'integer'; did you mean 'int'?"),
    ("study-param-unknown-key.toml", "space.max_num_seqs.hihg", "did you mean 'high'?"),
    ("study-when-unknown.toml", "space.num_speculative_tokens.when.speculative_methd",
     "did you mean 'speculative_method'?"),
    ("study-when-never.toml", "space.num_speculative_tokens.when.speculative_method", "can never be 'eagle'"),
    ("study-when-cycle.toml", "space.enable_chunked_prefill.when", "cycle"),
    ("study-tokens-without-method.toml", "space.num_speculative_tokens", "needs a speculative_method"),
    ("study-unknown-section.toml", "engnie", "did you mean 'engine'?"),
    ("study-dash-flag.toml", "engine.max-num-seqs", "did you mean 'max_num_seqs'?"),
    ("study-missing-objective.toml", "objective", "file not found"),
    ("study-bad-duration.toml", "budget.boot_timeout", "got '4x'"),
    ("study-bad-remeasure.toml", "budget.remeasure", "must be >= 0, got -1"),
    ("study-baseline-refused.toml", "baselines[0].flags",
     "max_num_batched_tokens (16) must be >= max_num_seqs (32)"),
    ("study-baseline-twice.toml", "baselines[1].name", "defined twice"),
    ("study-fixed-and-searched.toml", "space.max_num_seqs", "both fixed in [engine] and searched"),
    ("study-bad-sampler.toml", "sampler.name", "did you mean 'tpe'?"),
    ("study-bad-start-picks.toml", "sampler.start_picks", "must be >= 0, got -1"),
    ("study-bad-tiny.toml", "model.path", "did you mean 'tiny:dense'?"),
    ("study-model-not-a-choice.toml", "space.model.choices", "must include the [model] path 'tiny:dense'"),
    ("study-no-model.toml", "model", "required key is missing"),
    ("study-reserved-port.toml", "engine.port", "the engine picks it"),
    ("study-bad-default.toml", "space.enable_prefix_caching.default", "'yes' is not a value"),
    ("study-env-bool.toml", "engine.env.VLLM_CPU_KVCACHE_SPACE", "must be a string or a number"),
    ("study-bad-hardware.toml", "hardware", "unknown GPU profile 'rtx3900'; did you mean 'rtx3090'?"),
    ("study-not-utf8.toml", None, "not UTF-8 text (byte 66: b'\\xe9')"),
]


@pytest.mark.parametrize(("name", "key", "fragment"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_file_names_file_and_key(name: str, key: str | None, fragment: str) -> None:
    path = BAD / name
    load = load_objective if name.startswith("obj-") else load_study
    with pytest.raises(SpecError) as info:
        load(path)
    err = info.value
    assert err.source == str(path)
    assert err.key == key
    assert fragment in err.message
    assert str(err).startswith(f"{path}: {key}: " if key else f"{path}: ")


def test_every_bad_file_is_tested() -> None:
    assert sorted(p.name for p in BAD.glob("*.toml")) == sorted(b[0] for b in BAD_FILES)


def test_error_text_matches_the_documented_form() -> None:
    with pytest.raises(SpecError) as info:
        load_study(BAD / "study-int-string.toml")
    assert str(info.value) == f"{BAD / 'study-int-string.toml'}: space.max_num_seqs.low: must be an integer, got 'abc'"


@pytest.mark.parametrize("path", sorted((ROOT / "objectives").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_objectives_load(path: Path) -> None:
    objective = load_objective(path)
    assert objective.name == path.stem


@pytest.mark.parametrize("path", sorted((ROOT / "studies").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_studies_load(path: Path) -> None:
    study = load_study(path)
    assert study.name == path.stem
    assert {b.name for b in study.baselines} == {"vllm-defaults", "recipe"}


def test_shipped_study_count() -> None:
    names = {p.stem for p in (ROOT / "studies").glob("*.toml")}
    assert {"tiny-cpu", "tiny-hybrid-cpu", "qwen3.5-27b-rtx3090"} <= names


def test_an_objective_maximises_throughput_unless_it_says_energy(tmp_path: Path) -> None:
    body = '[workload]\ninput_len = 8\noutput_len = 4\n[limits]\np95_ttft_ms = 10\n'
    assert load_objective(_write(tmp_path, "plain.toml", body)).maximize == "output_throughput"
    energy = load_objective(_write(tmp_path, "energy.toml", 'maximize = "output_tokens_per_joule"\n' + body))
    assert (energy.maximize, energy.energy_key) == ("output_tokens_per_joule", "maximize")
    limited = load_objective(_write(tmp_path, "limit.toml", body + "joules_per_token = 0.5\n"))
    assert (limited.maximize, limited.energy_key) == ("output_throughput", "limits.joules_per_token")


def test_tiny_objective_values() -> None:
    o = load_objective(ROOT / "objectives" / "tiny-cpu.toml")
    assert o.maximize == "output_throughput" and o.energy_key is None
    assert (o.workload.input_len.kind, o.workload.input_len.mean) == ("fixed", 256)
    assert o.workload.output_len.mean == 64
    assert (o.limits.p95_ttft_ms, o.limits.p95_tpot_ms, o.limits.p95_e2el_ms) == (500.0, 50.0, None)
    assert (o.load.mode, o.load.max, o.load.min_requests, o.load.warmup_requests) == ("concurrency", 64, 32, 8)


def test_qwen_study_values() -> None:
    s = load_study(ROOT / "studies" / "qwen3.5-27b-rtx3090.toml")
    assert s.hardware == "rtx3090"
    assert s.objective.name == "chat-p95"
    assert s.model.path == "Qwen/Qwen3.5-27B-GPTQ-Int4"
    space = {p.name: p for p in s.space}
    assert space["model"].default == "Qwen/Qwen3.5-27B-GPTQ-Int4"  # the [model] path fills baselines
    assert space["num_speculative_tokens"].when == {"speculative_method": "mtp"}
    order = [p.name for p in s.space]
    assert order.index("speculative_method") < order.index("num_speculative_tokens")
    assert space["max_model_len"].choices == (4096, 8192, 16384, 32768)
    # 16-bit recurrent state halves the Gated DeltaNet state per sequence; vLLM's default "auto" (float32 here)
    assert space["mamba_ssm_cache_dtype"].choices == ("auto", "float16", "bfloat16")
    assert space["mamba_ssm_cache_dtype"].default == "auto"
    assert s.boot_timeout_s == 900 and s.time_budget_s == 4 * 3600
    recipe = next(b for b in s.baselines if b.name == "recipe")
    assert recipe.flags == {"max_num_seqs": 48, "max_num_batched_tokens": 8192, "enable_chunked_prefill": True,
                            "max_model_len": 8192}


def _write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    _write(tmp_path, "objectives/data/prompts.jsonl", '{"prompt": "hi"}\n')
    _write(tmp_path, "objectives/o.toml",
           '[workload]\ninput_len = 8\noutput_len = 4\ndataset = "data/prompts.jsonl"\n'
           '[limits]\np95_e2el_ms = 1000\n')
    _write(tmp_path, "models/mine/config.json", "{}")
    study = _write(tmp_path, "studies/s.toml",
                   'objective = "../objectives/o.toml"\n[model]\npath = "../models/mine"\n'
                   '[engine.env]\nVLLM_CPU_KVCACHE_SPACE = 1\n'
                   '[space.max_num_seqs]\ntype = "int"\nlow = 1\nhigh = 8\n'
                   '[space.enable_chunked_prefill]\ntype = "bool"\nwhen = { max_num_seqs = [4, 8] }\n')
    s = load_study(study)
    assert s.objective.workload.dataset == (tmp_path / "objectives" / "data" / "prompts.jsonl").resolve()
    assert s.model.path == str((tmp_path / "models" / "mine").resolve())
    assert s.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert s.hardware == "auto" and s.storage is None and s.sampler.name == "random" and s.sampler.start_picks == 10
    assert s.boot_timeout_s == 600  # the 10m default
    assert s.remeasure == 3  # the top three are re-measured unless [budget] remeasure says otherwise
    assert s.space[1].when == {"max_num_seqs": [4, 8]}


def test_conditions_reorder_the_space(tmp_path: Path) -> None:
    _write(tmp_path, "o.toml", '[workload]\ninput_len = 8\noutput_len = 4\n[limits]\np95_ttft_ms = 10\n')
    study = _write(tmp_path, "s.toml",
                   'objective = "o.toml"\n[model]\npath = "org/model"\n'
                   '[space.num_speculative_tokens]\ntype = "int"\nlow = 1\nhigh = 3\n'
                   'when = { speculative_method = "mtp" }\n'
                   '[space.speculative_method]\ntype = "categorical"\nchoices = ["none", "mtp"]\n')
    s = load_study(study)
    assert [p.name for p in s.space] == ["speculative_method", "num_speculative_tokens"]
    assert s.model.path == "org/model"  # a hub id stays as written


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("4h", 14400), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("2d", 172800), ("1.5h", 5400),
     ("1h0m30s", 3630), (120, 120), (2.5, 2.5)],
)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["4x", "", "h", "30m1h", "-5m", "0s", "4 hours", True, 0])
def test_parse_duration_refuses(text: object) -> None:
    with pytest.raises(SpecError) as info:
        parse_duration(text, key="--budget")
    assert info.value.key == "--budget"


def test_a_model_directory_that_does_not_exist_is_named(tmp_path: Path) -> None:
    _write(tmp_path, "o.toml", '[workload]\ninput_len = 8\noutput_len = 4\n[limits]\np95_ttft_ms = 10\n')
    study = _write(tmp_path, "s.toml", 'objective = "o.toml"\n[model]\npath = "./models/nope"\n')
    with pytest.raises(SpecError, match=r"s\.toml: model\.path: no model directory .*models/nope"):
        load_study(study)


def test_text_prompts_need_the_models_tokenizer_before_anything_boots(tmp_path: Path) -> None:
    """One line naming the objective file and the key, for a model directory without a tokenizer.json, through the
    CLI's `trial` and `run` (exit 2, nothing written); a tiny model (its tokenizer is generated) passes."""
    import subprocess
    import sys

    from autotune.config.study_file import study_models
    from autotune.config.workload_checks import check_prompt_tokenizer
    from autotune.engine.models import write_tiny_model

    objective = _write(tmp_path, "text.toml", '[workload]\ninput_len = 8\noutput_len = 4\nprompt = "text"\n'
                                              '[limits]\np95_ttft_ms = 10\n')
    assert load_objective(objective).workload.prompt == "text"
    assert load_objective(ROOT / "tests" / "data" / "quick" / "quick-objective.toml").workload.prompt == "token_ids"
    bare = tmp_path / "models" / "bare"
    write_tiny_model("dense", bare)
    check_prompt_tokenizer(load_objective(objective), [str(bare), "tiny:dense"])  # both have one
    (bare / "tokenizer.json").unlink()
    with pytest.raises(SpecError) as info:
        check_prompt_tokenizer(load_objective(objective), [str(bare)])
    assert (info.value.source, info.value.key) == (str(objective), "workload.prompt")
    # The model without one is only a choice of the searched `model`: still refused before the first boot.
    study = _write(tmp_path, "s.toml", 'objective = "text.toml"\n[model]\npath = "tiny:dense"\n'
                                       '[space.model]\ntype = "categorical"\n'
                                       'choices = ["tiny:dense", "./models/bare"]\n')
    assert study_models(load_study(study)) == ["tiny:dense", str(bare)]
    cli = [sys.executable, "-m", "autotune.cli"]
    for argv in (["trial", "--model", str(bare), "--objective", str(objective)],
                 ["run", str(study), "--n-trials", "1"]):
        out = subprocess.run([*cli, *argv], capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 2, out.stdout + out.stderr
        lines = (out.stdout + out.stderr).strip().splitlines()
        assert len(lines) == 1 and f"{objective}: workload.prompt:" in lines[0] and "tokenizer.json" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "s.toml", "text.toml"]  # nothing written


@pytest.mark.parametrize(("dest", "value", "problem"), [
    ("max_num_seqs", 16, None), ("max_num_seqs", "16", None), ("max_num_seqs", "lots", "must be an integer"),
    ("max_num_seqs", 16.0, "must be an integer"), ("max_num_seqs", True, "takes a value, not true or false"),
    ("max_num_batched_tokens", "2k", None), ("max_model_len", "auto", None),
    ("max_num_batched_tokens", "auto", "must be an integer (or like '2k')"),
    ("gpu_memory_utilization", 0.9, None), ("gpu_memory_utilization", "most", "must be a number"),
    ("enforce_eager", True, None), ("enforce_eager", "yes", "must be true or false"),
    ("kv_cache_dtype", "fp8", None), ("kv_cache_dtype", "fp7", "must be one of auto, "),
    ("speculative_config", {"method": "mtp", "num_speculative_tokens": 2}, None),
])
def test_flag_values_are_judged_by_the_installed_vllms_parser_types(dest: str, value: object,
                                                                    problem: str | None) -> None:
    from autotune.engine import flag_checks as flags

    found = flags.value_problem(flags.flag_types()[dest], value)
    assert found == problem if problem is None else (found or "").startswith(problem), found


@pytest.mark.parametrize("path", sorted((ROOT / "studies").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_studies_give_vllm_values_it_takes(path: Path) -> None:
    from autotune.config import study_file
    from autotune.engine import flag_checks as flags

    flags.check_values(study_file.study_flag_values(load_study(path)))
def test_param_holds_is_one_rule_for_every_caller():
    """Param.holds: bools by type, categoricals by membership (True is not 1), numbers in [low, high]
    unless in_range=False, and an int parameter only integral values."""
    from autotune.config.params import Param

    n = Param("max_num_seqs", "int", low=8, high=64)
    assert n.holds(8) and n.holds(64) and n.holds(16.0)
    assert not n.holds(4) and not n.holds(65) and not n.holds(16.5)
    assert n.holds(256, in_range=False) and not n.holds(16.5, in_range=False)
    assert not n.holds(True) and not n.holds("16") and not n.holds(None)
    f = Param("gpu_memory_utilization", "float", low=0.5, high=0.9)
    assert f.holds(0.5) and f.holds(0.75) and not f.holds(0.95) and f.holds(0.95, in_range=False)
    assert not f.holds(False, in_range=False)
    b = Param("enforce_eager", "bool")
    assert b.holds(True) and b.holds(False) and not b.holds(1) and not b.holds(0, in_range=False)
    c = Param("kv_cache_dtype", "categorical", choices=("auto", "fp8", 1))
    assert c.holds("fp8") and c.holds(1) and not c.holds(True) and not c.holds("fp16")


def test_an_unknown_tiny_model_is_an_autotune_error_the_cli_reports_in_one_line():
    from autotune.engine.models import resolve_model
    from autotune.errors import AutotuneError, ModelError

    with pytest.raises(ModelError, match="unknown tiny model 'tiny:nope'") as e:
        resolve_model("tiny:nope")
    assert isinstance(e.value, AutotuneError) and e.value.exit_code == 2


def test_pseudo_parameters_are_searched_only_as_the_fold_into_vllm_flags_can_take_them():
    """engine/flags holds the rules: model and speculative_method as string categoricals, the token count as an
    int that needs a method (searched, fixed, or a fixed speculative_config) to fold into."""
    from autotune.engine.flags import pseudo_param_problem, spec_tokens_problem

    assert pseudo_param_problem("model", "categorical", ("a", "b")) is None
    assert "string choices" in (pseudo_param_problem("model", "categorical", ("a", 1)) or "")
    assert "string choices" in (pseudo_param_problem("speculative_method", "int", ()) or "")
    assert pseudo_param_problem("num_speculative_tokens", "int", ()) is None
    assert "must be an int" in (pseudo_param_problem("num_speculative_tokens", "float", ()) or "")
    assert pseudo_param_problem("max_num_seqs", "float", ()) is None
    assert "needs a speculative_method" in (spec_tokens_problem({"num_speculative_tokens"}, {}) or "")
    assert spec_tokens_problem({"num_speculative_tokens", "speculative_method"}, {}) is None
    assert spec_tokens_problem({"num_speculative_tokens"}, {"speculative_config": {}}) is None
    assert spec_tokens_problem({"max_num_seqs"}, {}) is None


def test_old_limit_names_are_read_with_a_one_line_notice(tmp_path: Path, capsys) -> None:
    old = _write(tmp_path, "old.toml", '[workload]\ninput_len = 8\noutput_len = 4\n[limits]\nttft_p95_ms = 10\n'
                                       'e2e_p95_ms = 900\n')
    assert load_objective(old).limits == Limits(p95_ttft_ms=10, p95_e2el_ms=900)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"notice: {old}: [limits]: read ttft_p95_ms as p95_ttft_ms, e2e_p95_ms as p95_e2el_ms")
    new = _write(tmp_path, "new.toml", '[workload]\ninput_len = 8\noutput_len = 4\n[limits]\np99_ttft_ms = 10\n')
    assert load_objective(new).limits == Limits(p99_ttft_ms=10) and capsys.readouterr().err == ""
