"""Flags -> argv / shell command / YAML / JSON, checked against the installed vLLM's own parser.

Fast: it only builds vLLM's server argument parser (a few seconds of imports); no server starts.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest
import yaml

from autotune.export import STORE_TRUE_ONLY, serve_command, to_argv, to_json, to_yaml

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
    assert shlex.split(command) == ["vllm", "serve", model, *to_argv(flags)]
    assert command.startswith("vllm serve '/models/my model'\"'\"'s dir' --served-model-name ")


def test_to_json() -> None:
    doc = json.loads(to_json("org/m", {"max_num_seqs": 8, "enforce_eager": True}, {"output_tok_s": 123.5}))
    assert doc == {"model": "org/m", "flags": {"max_num_seqs": 8, "enforce_eager": True},
                   "argv": ["--max-num-seqs", "8", "--enforce-eager"],
                   "command": "vllm serve org/m --max-num-seqs 8 --enforce-eager", "metrics": {"output_tok_s": 123.5}}


def test_to_yaml_shape() -> None:
    doc = yaml.safe_load(to_yaml({"max_num_seqs": 8, "enable_prefix_caching": False, "disable_log_stats": False,
                                  "speculative_config": {"method": "mtp"}}, model="org/m"))
    assert doc == {"model": "org/m", "max-num-seqs": 8, "enable-prefix-caching": False,
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


def test_store_true_only_matches_vllm(vllm_parser: argparse.ArgumentParser) -> None:
    """False means --no-X except for these; if vLLM changes a flag's action, this must fail."""
    store_true = {a.dest for a in vllm_parser._actions if isinstance(a, argparse._StoreTrueAction)}
    assert store_true == STORE_TRUE_ONLY
    negatable = {a.dest for a in vllm_parser._actions if isinstance(a, argparse.BooleanOptionalAction)}
    assert {"enforce_eager", "enable_chunked_prefill", "enable_prefix_caching", "async_scheduling"} <= negatable
