"""Bad input to the CLI: every case is one line naming the file, key or flag, exit 2, and nothing written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "tests" / "data" / "quick"
LEDGER: list[tuple[str, bool, int]] = []  # (case, refused as promised, trials lost)


@pytest.fixture()
def quick(tmp_path: Path) -> Path:
    for f in QUICK.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / "quick.toml"


QUICK_HEAD = "name = 'quick'\nobjective = 'quick-objective.toml'\n[model]\npath = 'tiny:dense'\n"


BAD_STUDIES: dict[str, tuple[str | bytes, str]] = {
    "malformed TOML": ("name = 'x'\n[model\n", "quick.toml"),
    "unknown key": ("name = 'quick'\nobjective = 'quick-objective.toml'\nmodle = 1\n", "modle"),
    "inverted range": ("name = 'quick'\nobjective = 'quick-objective.toml'\n[model]\npath = 'tiny:dense'\n"
                       "[space.max_num_seqs]\ntype = 'int'\nlow = 64\nhigh = 8\n", "max_num_seqs"),
    "flag vLLM does not know": ("name = 'quick'\nobjective = 'quick-objective.toml'\n[model]\npath = 'tiny:dense'\n"
                                "[engine]\nmax_num_seqz = 4\n", "max_num_seqz"),
    "missing model directory": ("name = 'quick'\nobjective = 'quick-objective.toml'\n[model]\npath = './models/none'\n",
                                "model.path"),
    "string for an integer flag in [engine]": (QUICK_HEAD + "[engine]\nmax_num_seqs = 'lots'\n",
                                               "engine.max_num_seqs: must be an integer"),
    "string for an integer flag in a baseline": (QUICK_HEAD + "[[baselines]]\nname = 'b'\n"
                                                 "flags = { max_num_seqs = 'lots' }\n",
                                                 "baselines[0].flags.max_num_seqs: must be an integer"),
    "word for a switch in [engine]": (QUICK_HEAD + "[engine]\nenforce_eager = 'yes'\n",
                                      "engine.enforce_eager: must be true or false"),
    "value outside a flag's choices": (QUICK_HEAD + "[engine]\nkv_cache_dtype = 'fp7'\n", "engine.kv_cache_dtype"),
    "string among a searched integer flag's choices": (QUICK_HEAD + "[space.max_num_seqs]\ntype = 'categorical'\n"
                                                       "choices = [4, 'many']\n", "space.max_num_seqs.choices"),
    "unknown hardware profile": (QUICK_HEAD.replace("[model]", "hardware = 'rtx9090'\n[model]"),
                                 "quick.toml: hardware: unknown GPU profile 'rtx9090'"),
    # The CPU build here (and in CI): a GPU study would boot a 27B model on two cores, failing trial after trial.
    "a GPU profile where there is no such GPU": (QUICK_HEAD.replace("[model]", "hardware = 'rtx3090'\n[model]"),
                                                "quick.toml: hardware: names the GPU profile 'rtx3090', but the "
                                                "installed vLLM is the CPU build"),
    "a memory cap without a CUDA GPU": (QUICK_HEAD.replace("[model]", "memory_cap_gib = 'rtx3090'\n[model]"),
                                        "quick.toml: memory_cap_gib: a memory cap needs a CUDA GPU"),
    # No network here, and a made-up id anywhere: either way one quick line, not 29 s of retries and a traceback.
    "hub id that cannot be resolved": (QUICK_HEAD.replace("tiny:dense", "nobody-xyz/no-such-model-4f1c"),
                                       "quick.toml: model.path: cannot resolve 'nobody-xyz/no-such-model-4f1c'"),
    "not UTF-8": (b"name = 'caf\xe9'\n", "quick.toml: not UTF-8"),
    # Our own messages name TOML tables in brackets: printed as text, not read as markup.
    "fixed and searched": (QUICK_HEAD + "[engine]\nmax_num_seqs = 4\n[space.max_num_seqs]\ntype = 'int'\n"
                                        "low = 1\nhigh = 8\n", "both fixed in [engine] and searched in [space]"),
    # Values that passed validation and failed after the database was written: each read as its reader reads it.
    "env value vLLM cannot read as an integer": (QUICK_HEAD + "[engine.env]\nVLLM_CPU_KVCACHE_SPACE = 'abc'\n",
                                                 "engine.env.VLLM_CPU_KVCACHE_SPACE: vLLM reads it as an integer"),
    "env value nan": (QUICK_HEAD + "[engine.env]\nVLLM_CPU_KVCACHE_SPACE = 'nan'\n",
                      "engine.env.VLLM_CPU_KVCACHE_SPACE"),
    "env value negative": (QUICK_HEAD + "[engine.env]\nVLLM_CPU_KVCACHE_SPACE = '-1'\n",
                           "engine.env.VLLM_CPU_KVCACHE_SPACE: must be a whole number of GiB, at least 1"),
    "env name with '='": (QUICK_HEAD + "[engine.env]\n'VLLM_A=B' = '1'\n",
                          "engine.env.VLLM_A=B: is not an environment"),
    "env name empty": (QUICK_HEAD + "[engine.env]\n'' = '1'\n", "is not an environment variable name"),
    "env value with a NUL byte": (QUICK_HEAD + "[engine.env]\nVLLM_LOGGING_LEVEL = \"INFO\\u0000x\"\n",
                                  "engine.env.VLLM_LOGGING_LEVEL: contains a NUL byte"),
    "negative seed": (QUICK_HEAD + "[sampler]\nseed = -1\n", "sampler.seed: must be >= 0"),
    "seed beyond numpy's": (QUICK_HEAD + f"[sampler]\nseed = {2**63 - 1}\n", "sampler.seed: must be <="),
    "baseline 0 on a log-scale parameter": (QUICK_HEAD + "[space.max_num_seqs]\ntype = 'int'\nlow = 2\nhigh = 16\n"
                                            "log = true\n[[baselines]]\nname = 'b'\nflags = { max_num_seqs = 0 }\n",
                                            "baselines[0].flags: vLLM would refuse this baseline: max_num_seqs (0)"),
    "baseline -1 max_num_seqs": (QUICK_HEAD + "[[baselines]]\nname = 'b'\nflags = { max_num_seqs = -1 }\n",
                                 "max_num_seqs (-1) must be >= 1"),
    "log-scale default 0": (QUICK_HEAD + "[space.max_num_seqs]\ntype = 'int'\nlow = 2\nhigh = 16\nlog = true\n"
                            "default = 0\n", "space.max_num_seqs.default: 0 is not a value"),
    "float range low = nan": (QUICK_HEAD + "[space.gpu_memory_utilization]\ntype = 'float'\nlow = nan\nhigh = 0.9\n",
                              "space.gpu_memory_utilization.low: must be a finite number"),
    "float range high = inf": (QUICK_HEAD + "[space.gpu_memory_utilization]\ntype = 'float'\nlow = 0.5\n"
                               "high = inf\n", "space.gpu_memory_utilization.high: must be a finite number"),
    "nan in a fixed float flag": (QUICK_HEAD + "[engine]\ngpu_memory_utilization = nan\n",
                                  "engine.gpu_memory_utilization: must be a finite number"),
    "budget time nan": (QUICK_HEAD + "[budget]\ntime = nan\n", "budget.time: must be a positive duration"),
    "boot_timeout nan": (QUICK_HEAD + "[budget]\nboot_timeout = nan\n", "budget.boot_timeout"),
    "boot_timeout inf": (QUICK_HEAD + "[budget]\nboot_timeout = inf\n", "budget.boot_timeout: must be at most"),
    "step wider than the range": (QUICK_HEAD + "[space.max_num_seqs]\ntype = 'int'\nlow = 2\nhigh = 16\n"
                                  "step = 32\n", "space.max_num_seqs.step: 32 is wider than the range [2, 16]"),
    # Names are printed on terminals: an escape sequence in one would retitle or redraw the user's.
    "escape sequence in a baseline name": (QUICK_HEAD + "[[baselines]]\nname = \"b\\u001b]0;owned\\u0007\"\n"
                                           "flags = {}\n", "baselines[0].name: contains the control character"),
    "escape sequence in the description": (QUICK_HEAD.replace("[model]", "description = \"x\\u001b[2J\"\n[model]"),
                                           "description: contains the control character '\\x1b'"),
    "byte-order mark": (b"\xef\xbb\xbf" + QUICK_HEAD.encode(), "quick.toml: begins with a byte-order mark"),
}


BAD_OBJECTIVES: dict[str, tuple[tuple[str, str], str]] = {  # (text replaced, replacement), what the line names
    "limit nan": (("ttft_p95_ms = 2000", "ttft_p95_ms = nan"), "limits.ttft_p95_ms: must be a finite number"),
    "limit inf": (("tpot_p95_ms = 200", "tpot_p95_ms = inf"), "limits.tpot_p95_ms: must be a finite number"),
    "std nan": (("input_len = 128", "input_len = { kind = 'normal', mean = 128, std = nan, min = 1, max = 256 }"),
                "workload.input_len.std: must be a finite number"),
    "load max inf": (("max = 4", "max = inf"), "load.max: must be a finite number"),
    "escape sequence in the objective's name": (('name = "quick"', 'name = "q\\u001b[31m"'),
                                                "quick-objective.toml: name: contains the control character"),
}


@pytest.mark.parametrize("fault", sorted(BAD_OBJECTIVES))
def test_bad_objective_files_fail_in_one_line_with_exit_2_and_nothing_written(quick: Path, fault: str) -> None:
    (old, new), named = BAD_OBJECTIVES[fault]
    objective = quick.parent / "quick-objective.toml"
    text = objective.read_text()
    assert old in text
    objective.write_text(text.replace(old, new))
    before = sorted(quick.parent.iterdir())
    out = CliRunner().invoke(main, ["run", str(quick), "--n-trials", "1"])
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = (out.exit_code == 2 and len(lines) == 1 and named in lines[0]
                and sorted(quick.parent.iterdir()) == before)
    LEDGER.append((f"bad input: objective {fault}", survived, 0))
    assert survived, out.output


@pytest.mark.parametrize("fault", sorted(BAD_STUDIES))
def test_bad_study_files_fail_in_one_line_with_exit_2_and_nothing_written(quick: Path, fault: str) -> None:
    text, named = BAD_STUDIES[fault]
    quick.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = sorted(quick.parent.iterdir())
    out = CliRunner().invoke(main, ["run", str(quick), "--n-trials", "1"])
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = (out.exit_code == 2 and len(lines) == 1 and named in lines[0]
                and sorted(quick.parent.iterdir()) == before)
    LEDGER.append((f"bad input: {fault}", survived, 0))
    assert survived, out.output


@pytest.mark.parametrize(("args", "named"), [
    (["--budget", "4x"], "--budget"),
    (["--n-trials", "1", "--storage", "postgresql+psycopg2://nobody@127.0.0.1:9/none"], "--storage"),
    (["--n-trials", "1", "--gpus", "0,0"], "--gpus"),
    (["--budget", "", "--n-trials", "1"], "--budget"),  # empty is not "the study's budget"
    (["--n-trials", "1", "--gpus", "97,98"], "--gpus: 97,98:"),  # no such GPUs here (none at all on the CPU build)
    (["--n-trials", "1", "--workers", str(len(os.sched_getaffinity(0)) + 1)], "--workers"),
])
def test_bad_command_lines_fail_in_one_line_with_exit_2(quick: Path, args: list[str], named: str) -> None:
    before = sorted(quick.parent.iterdir())
    out = CliRunner().invoke(main, ["run", str(quick), *args])
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = out.exit_code == 2 and len(lines) == 1 and named in lines[0] and sorted(quick.parent.iterdir()) == before
    LEDGER.append((f"bad input: run {' '.join(args)}", survived, 0))
    assert survived, out.output


@pytest.mark.parametrize(("args", "named"), [
    (["trial", "--model", "tiny:nope", "--objective", str(QUICK / "quick-objective.toml")], "--model: tiny:nope"),
    (["estimate", "--model", "tiny:nope"], "--model: tiny:nope"),
    (["estimate", "--model", "nobody-xyz/no-such-model-4f1c"], "--model: nobody-xyz/no-such-model-4f1c"),
    (["dashboard", "--port", "99999"], "--port"),
    (["dashboard", "--port", "-1"], "--port"),
    (["trial", "--model", "tiny:dense", "--objective", str(QUICK / "quick-objective.toml"), "--set",
      "max_num_seqs=lots"], "--set: max_num_seqs: must be an integer"),
])
def test_bad_values_of_other_commands_fail_in_one_line_with_exit_2(tmp_path: Path, args: list[str], named: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # where `trial` would write its log, and `dashboard` look for studies
    out = CliRunner().invoke(main, args)
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = out.exit_code == 2 and len(lines) == 1 and named in lines[0] and not list(tmp_path.iterdir())
    LEDGER.append((f"bad input: {' '.join(args[:3])}", survived, 0))
    assert survived, out.output


@pytest.mark.parametrize("folder", ["a[/x]b", "[bold]", "[engine]"])
def test_paths_with_brackets_are_printed_as_they_are(tmp_path: Path, folder: str) -> None:
    """A path (or any text not ours) in an error is text, not rich markup: no crash, no missing characters."""
    missing = tmp_path / folder / "none.toml"
    out = CliRunner().invoke(main, ["run", str(missing), "--n-trials", "1"])
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = out.exit_code == 2 and lines == [f"error: {missing}: file not found"]
    LEDGER.append((f"bad input: a path containing {folder}", survived, 0))
    assert survived, out.output


def test_zz_bad_input_count(capsys: pytest.CaptureFixture[str]) -> None:
    refused = sum(ok for _, ok, _ in LEDGER)
    with capsys.disabled():
        print(f"\nbad input: {len(LEDGER)} cases, {refused} refused in one line with nothing written")
        for case, ok, _ in LEDGER:
            print(f"  {'ok  ' if ok else 'FAIL'} {case}")
    assert LEDGER and refused == len(LEDGER)
