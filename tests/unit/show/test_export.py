"""Flags -> argv / shell command / YAML / JSON, checked against the installed vLLM's own parser.

Fast: it only builds vLLM's server argument parser (a few seconds of imports); no server starts.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.engine.flags import (
    STORE_TRUE_ONLY,
    Build,
    config_command,
    installed_vllm,
    serve_command,
    serve_program,
    to_argv,
)
from autotune.show.export import docker_command, to_json, to_yaml

ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "ODD": "a b'$HOME \"x\"\nsecond line"}
# Stands in for `vllm` as the program a pasted command runs: prints what the shell gave it.
SHOW = (sys.executable, "-c", "import json, os, sys; print(json.dumps({'env': {k: os.environ.get(k) for k in "
        + repr(sorted(ENV)) + "}, 'argv': sys.argv[1:]}))")

FLAGS = {
    "max_num_seqs": 16,
    "max_num_batched_tokens": 8192,
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.93,
    "kv_cache_dtype": "fp8",
    "enable_chunked_prefill": False,
    "enable_prefix_caching": True,
    "enforce_eager": True,
    "async_scheduling": False,
    "speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
    "scheduling_policy": "priority",
    "seed": -1,
    "cudagraph_capture_sizes": [1, 2, 4, 8],
    "served_model_name": ["it's \"my\" model"],
}


def test_to_argv_forms() -> None:
    argv = to_argv({"max_num_seqs": 16, "enable_prefix_caching": True, "enable_chunked_prefill": False,
                    "disable_log_stats": False, "speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
                    "gpu_memory_utilization": 0.9, "seed": -1, "block_size": None, "cudagraph_capture_sizes": [1, 2]})
    assert argv == ["--max-num-seqs", "16", "--enable-prefix-caching", "--no-enable-chunked-prefill",
                    "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}',
                    "--gpu-memory-utilization", "0.9", "--seed=-1", "--cudagraph-capture-sizes", "1", "2"]


def test_to_argv_refuses_non_dest_names() -> None:
    for bad in ({"max-num-seqs": 1}, {"model": "x"}, {"Max_num_seqs": 1}):
        with pytest.raises(ValueError):
            to_argv(bad)


def test_serve_command_quoting_round_trips() -> None:
    model = "/models/my model's dir"
    flags = {"served_model_name": ['a "quoted" name'], "max_num_seqs": 4, "chat_template": "{{ x }} $HOME; rm -rf"}
    command = serve_command(model, flags)
    assert shlex.split(command) == ["vllm", "serve", model, "--host", "127.0.0.1", *to_argv(flags)]
    assert command.startswith("vllm serve '/models/my model'\"'\"'s dir' --host 127.0.0.1 --served-model-name ")


def test_to_json() -> None:
    doc = json.loads(to_json("org/m", {"max_num_seqs": 8, "enforce_eager": True}, {"output_throughput": 123.5},
                             {"VLLM_USE_FLASHINFER_SAMPLER": "0"}))
    here = shlex.join(serve_program())  # what starts the server where autotune runs (the CPU build's differs)
    assert doc.pop("docker").startswith("docker run --gpus all ")
    assert doc == {"model": "org/m", "flags": {"max_num_seqs": 8, "enforce_eager": True},
                   "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
                   "argv": ["--host", "127.0.0.1", "--max-num-seqs", "8", "--enforce-eager"],
                   "command": f"VLLM_USE_FLASHINFER_SAMPLER=0 {here} org/m --host 127.0.0.1 --max-num-seqs 8 "
                              "--enforce-eager",
                   "metrics": {"output_throughput": 123.5}}


def test_serve_command_sets_the_environment_in_a_real_shell() -> None:
    """The env words run through bash as a user would paste them: every value arrives intact, flags unchanged."""
    command = serve_command("org/model", {"max_num_seqs": 4}, ENV, program=SHOW)
    assert command.startswith("VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_CPU_KVCACHE_SPACE=1 ODD=")
    seen = json.loads(subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout)
    assert seen == {"env": ENV, "argv": ["org/model", "--host", "127.0.0.1", "--max-num-seqs", "4"]}
    assert serve_command("org/m", {"max_num_seqs": 4}, {}) == "vllm serve org/m --host 127.0.0.1 --max-num-seqs 4"
    with pytest.raises(ValueError, match="not an environment variable name"):
        serve_command("org/m", {}, {"A-B": "1"})  # a shell would run `A-B=1` as the command


def test_to_yaml_shape() -> None:
    doc = yaml.safe_load(to_yaml({"max_num_seqs": 8, "enable_prefix_caching": False, "disable_log_stats": False,
                                  "speculative_config": {"method": "mtp"}}, model="org/m"))
    assert doc == {"model": "org/m", "host": "127.0.0.1", "max-num-seqs": 8, "enable-prefix-caching": False,
                   "speculative-config": {"method": "mtp"}}


@pytest.fixture(scope="module")
def vllm_parser() -> argparse.ArgumentParser:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def _assert_parsed(ns: argparse.Namespace, flags: dict) -> None:
    for dest, value in flags.items():
        assert getattr(ns, dest) == value, dest
        assert type(getattr(ns, dest)) is type(value), dest


def test_vllm_parses_argv_back(vllm_parser: argparse.ArgumentParser) -> None:
    ns = vllm_parser.parse_args(["org/model", *to_argv(FLAGS)])
    assert ns.model_tag == "org/model"
    _assert_parsed(ns, FLAGS)


def test_vllm_parses_shell_command_back(vllm_parser: argparse.ArgumentParser) -> None:
    words = shlex.split(serve_command("org/model", FLAGS))
    assert words[:2] == ["vllm", "serve"]
    _assert_parsed(vllm_parser.parse_args(words[2:]), FLAGS)


def test_vllm_reads_yaml_config(vllm_parser: argparse.ArgumentParser, tmp_path: Path) -> None:
    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(FLAGS))
    _assert_parsed(vllm_parser.parse_args(["org/model", "--config", str(config)]), FLAGS)
    with_model = tmp_path / "with-model.yaml"
    with_model.write_text(to_yaml({"max_num_seqs": 3}, model="org/other"))
    ns = vllm_parser.parse_args(["--config", str(with_model)])
    assert (ns.model, ns.max_num_seqs) == ("org/other", 3)


def test_vllm_reads_yaml_config_with_the_environment_in_its_header(vllm_parser: argparse.ArgumentParser,
                                                                    tmp_path: Path) -> None:
    """vLLM's loader makes a flag of every key and refuses `env:`, so the environment is a comment it skips."""
    config = tmp_path / "best.yaml"
    text = to_yaml(FLAGS, model="org/model", env=ENV)
    config.write_text(text)
    ns = vllm_parser.parse_args(["--config", str(config)])
    assert ns.model == "org/model"
    _assert_parsed(ns, FLAGS)
    header = [line[2:] for line in text.splitlines() if line.startswith("# ")]
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in header and "VLLM_CPU_KVCACHE_SPACE=1" in header
    assert shlex.split("\n".join(header[header.index("VLLM_USE_FLASHINFER_SAMPLER=0"):])) == [
        f"{k}={v}" for k, v in ENV.items()]  # the quoted words, multi-line value included, read back exactly
    with_env_key = tmp_path / "env-key.yaml"
    with_env_key.write_text(yaml.safe_dump({"max-num-seqs": 3, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}))
    with pytest.raises(SystemExit):  # why the header is a comment: vLLM has no place for it
        vllm_parser.parse_args(["org/model", "--config", str(with_env_key)])


def test_every_export_listens_where_the_server_was_measured(vllm_parser: argparse.ArgumentParser,
                                                            tmp_path: Path) -> None:
    """The measured server listened on 127.0.0.1; vLLM's default (no --host) is every interface. The command,
    the YAML and the JSON's argv, read back by vLLM's own parser, keep the server on 127.0.0.1."""
    words = shlex.split(serve_command("org/model", FLAGS))
    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(FLAGS, model="org/model"))
    argv = json.loads(to_json("org/model", FLAGS, {}))["argv"]
    for ns in (vllm_parser.parse_args(words[2:]), vllm_parser.parse_args(["--config", str(config)]),
               vllm_parser.parse_args(["org/model", *argv])):
        assert ns.host == "127.0.0.1"
        _assert_parsed(ns, FLAGS)
    assert vllm_parser.parse_args(["org/model"]).host is None  # what no --host gives: every interface


def test_store_true_only_matches_vllm(vllm_parser: argparse.ArgumentParser) -> None:
    """False means --no-X except for these; if vLLM changes a flag's action, this must fail."""
    store_true = {a.dest for a in vllm_parser._actions if isinstance(a, argparse._StoreTrueAction)}
    assert store_true == STORE_TRUE_ONLY
    negatable = {a.dest for a in vllm_parser._actions if isinstance(a, argparse.BooleanOptionalAction)}
    assert {"enforce_eager", "enable_chunked_prefill", "enable_prefix_caching", "async_scheduling"} <= negatable


def test_a_capped_studys_winner_that_served_above_the_capped_card_is_exported_with_a_caution() -> None:
    """The H200 capped as a 3090 (h200-as-rtx3090-awq): the best configuration so far served at 23.78 GiB (NVML), above
    the 23.62 GiB CUDA has on a 24 GiB card. The flags are for that card, so every format says it may not fit, and names
    the filter that exports the best one that stayed under it."""
    import optuna
    from conftest import recorded_level

    from autotune.engine.logs import BootInfo
    from autotune.fit import memcap
    from autotune.measure.memory import MemoryPeak
    from autotune.measure.trial import TrialResult
    from autotune.search import record, tell
    from autotune.show.export import export_winner

    cap_gib = memcap.parse_cap("rtx3090").cuda_total_gib
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="maximize")
    for tok_s, peak_gib in ((612.0, 23.78), (516.0, 23.50)):
        trial = study.ask()
        for key, value in record.config_attrs("Qwen/Qwen3.5-27B-GPTQ-Int4", {"max_num_seqs": 52}).items():
            trial.set_user_attr(key, value)
        trial.set_user_attr(record.CAP_ATTR, cap_gib)
        level = recorded_level(16, tok_s, 400)
        tell.tell_result(study, trial, TrialResult("ok", tok_s, 16, (level,), BootInfo(100.0),
                                                   memory=MemoryPeak(int(peak_gib * 2**30), "nvml", 0, 50)))
    caution = "it served at 23.78 GiB, above the 23.62 GiB CUDA has on the capped card: it may not fit there"
    text, notes = export_winner(study, "flags")
    assert notes[0].startswith("best: trial 0, 612 output tok/s") and caution in notes[-1]
    assert text.startswith(shlex.join(serve_program()))
    assert "--max-vram 23.62" in notes[-1]
    assert f"# {notes[-1]}" in export_winner(study, "yaml")[0]
    assert caution in json.loads(export_winner(study, "json")[0])["metrics"]["caution"]
    # filtered as the caution says: the best that stayed under the card's memory, and nothing to caution about
    text, notes = export_winner(study, "flags", max_vram=23.62)
    assert notes[0].startswith("best: trial 1, 516 output tok/s") and not any("caution" in n for n in notes)


def test_each_format_is_read_back_by_vllms_parser(vllm_parser: argparse.ArgumentParser) -> None:
    """What runs where autotune runs (the CPU build's API server module; `vllm serve` on the CUDA build) and the
    docker line's arguments after the image: vLLM's own parser reads back the model and every flag."""
    cpu = shlex.split(serve_command("org/model", FLAGS, {}, serve_program(Build.CPU)))
    assert cpu[:4] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    ns = vllm_parser.parse_args(cpu[3:])
    assert ns.model == "org/model"
    _assert_parsed(ns, FLAGS)
    assert shlex.split(serve_command("org/model", FLAGS, {}, serve_program(Build.CUDA)))[:3] == [
        "vllm", "serve", "org/model"]
    assert config_command(Build.CPU) == "python -m vllm.entrypoints.openai.api_server --config FILE"
    assert config_command(Build.CUDA) == "vllm serve --config FILE"

    docker = shlex.split(docker_command("org/model", FLAGS, {"ODD": ENV["ODD"]}))
    image = next(i for i, word in enumerate(docker) if word.startswith("vllm/vllm-openai:v"))
    assert docker[:4] == ["docker", "run", "--gpus", "all"] and docker[image - 2:image] == ["-e", f"ODD={ENV['ODD']}"]
    assert docker[image] == f"vllm/vllm-openai:v{installed_vllm()[1]}"
    ns = vllm_parser.parse_args(docker[image + 1:])
    assert ns.model == "org/model"
    _assert_parsed(ns, FLAGS)
    local = shlex.split(docker_command("/models/mine", {}))
    assert "/models/mine:/models/mine:ro" in local  # a local model's folder is mounted where the flags name it


def test_the_yaml_says_how_to_serve_it_here() -> None:
    text = to_yaml({"max_num_seqs": 3}, model="org/m")
    assert text.splitlines()[0] == f"# serve it: {config_command()}"
