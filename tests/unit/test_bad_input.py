"""Bad input to the CLI: every case is one line naming the file, key or flag, exit 2, and nothing written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "tests" / "data" / "quick"
LEDGER: list[tuple[str, bool, int]] = []  # (case, refused as promised, trials lost)


@pytest.fixture()
def quick(tmp_path: Path) -> Path:
    for f in QUICK.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / "quick.toml"


TRIAL = ["trial", "--model", "tiny:dense", "--objective", str(QUICK / "quick-objective.toml")]


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
    "a vLLM version that is not one": (QUICK_HEAD.replace("[model]", "vllm_version = 'latest'\n[model]"),
                                       "quick.toml: vllm_version: 'latest' is not a vLLM version"),
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
    "flag value with a NUL byte": (QUICK_HEAD + "[engine]\ntokenizer_revision = \"a\\u0000b\"\n",
                                   "engine.tokenizer_revision: contains a NUL byte"),
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
    # What a study may do to the host that runs it: no loader or path variable, no flag that breaks the tuner's
    # client or runs code, unless this host's user allows it (--allow-env, --allow-flag).
    "PYTHONPATH in [engine.env]": (QUICK_HEAD + "[engine.env]\nPYTHONPATH = '/tmp/evil'\n",
                                   "engine.env.PYTHONPATH: names a path the server may load code from"),
    "LD_PRELOAD in [engine.env]": (QUICK_HEAD + "[engine.env]\nLD_PRELOAD = '/tmp/evil.so'\n",
                                   "engine.env.LD_PRELOAD: names a path"),
    "PYTHONSTARTUP in [engine.env]": (QUICK_HEAD + "[engine.env]\nPYTHONSTARTUP = '/tmp/evil.py'\n",
                                      "engine.env.PYTHONSTARTUP: is not a variable vLLM reads"),
    "VLLM_API_KEY in [engine.env]": (QUICK_HEAD + "[engine.env]\nVLLM_API_KEY = 'sk-s3cret'\n",
                                     "engine.env.VLLM_API_KEY: cannot be set"),
    "api_key in [engine]": (QUICK_HEAD + "[engine]\napi_key = 'sk-s3cret'\n",
                            "engine.api_key: cannot be set: the server would refuse the tuner's own requests"),
    "api_key in a baseline": (QUICK_HEAD + "[[baselines]]\nname = 'b'\nflags = { api_key = 'sk-s3cret' }\n",
                              "baselines[0].flags.api_key: cannot be set"),
    "uds": (QUICK_HEAD + "[engine]\nuds = '/tmp/vllm.sock'\n", "engine.uds: cannot be set: the server would listen"),
    "ssl_keyfile": (QUICK_HEAD + "[engine]\nssl_keyfile = '/tmp/key.pem'\n", "engine.ssl_keyfile: cannot be set"),
    "headless": (QUICK_HEAD + "[engine]\nheadless = true\n", "engine.headless: cannot be set"),
    "middleware": (QUICK_HEAD + "[engine]\nmiddleware = ['evil.Middleware']\n",
                   "engine.middleware: cannot be set from a study: it imports Python code"),
    "trust_remote_code": (QUICK_HEAD + "[engine]\ntrust_remote_code = true\n",
                          "engine.trust_remote_code: cannot be set from a study"),
    "trust_remote_code searched": (QUICK_HEAD + "[space.trust_remote_code]\ntype = 'bool'\n",
                                   "space.trust_remote_code.type: cannot be set from a study"),
    "chat_template path": (QUICK_HEAD + "[engine]\nchat_template = '/etc/passwd'\n",
                           "engine.chat_template: cannot be set from a study: a template file"),
    "a compile cache folder in compilation_config": (QUICK_HEAD + "[engine]\ncompilation_config = { cache_dir = "
                                                      "'/tmp/evil' }\n", "engine.compilation_config: cannot be set "
                                                                          "from a study with 'cache_dir'"),
    "a connector module in kv_transfer_config": (QUICK_HEAD + "[engine.kv_transfer_config]\nkv_connector = 'X'\n"
                                                 "kv_connector_module_path = 'evil'\nkv_role = 'kv_both'\n",
                                                 "engine.kv_transfer_config: cannot be set from a study with "
                                                 "'kv_connector_module_path'"),
    "download_dir": (QUICK_HEAD + "[engine]\ndownload_dir = '/home/someone/.ssh'\n",
                     "engine.download_dir: cannot be set from a study"),
    "allowed_origins": (QUICK_HEAD + "[engine]\nallowed_origins = ['*']\n",
                        "engine.allowed_origins: cannot be set from a study: it widens who may call"),
}


BAD_OBJECTIVES: dict[str, tuple[tuple[str, str], str]] = {  # (text replaced, replacement), what the line names
    "limit nan": (("p95_ttft_ms = 2000", "p95_ttft_ms = nan"), "limits.p95_ttft_ms: must be a finite number"),
    "limit inf": (("p95_tpot_ms = 200", "p95_tpot_ms = inf"), "limits.p95_tpot_ms: must be a finite number"),
    "std nan": (("input_len = 128", "input_len = { kind = 'normal', mean = 128, std = nan, min = 1, max = 256 }"),
                "workload.input_len.std: must be a finite number"),
    "load max inf": (("max = 4", "max = inf"), "load.max: must be a finite number"),
    "negative workload seed": (("output_len = 32", "output_len = 32\nseed = -1"), "workload.seed: must be >= 0"),
    "input_len beyond the model's positions": (("input_len = 128", "input_len = 9000"),
                                               "workload.input_len: requests of 9,000 tokens in and 32 out exceed the "
                                               "8,192 positions of tiny:dense"),
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
    # `trial` checks what `run` checks: the GPUs, vLLM's rules between flags, finite values, the environment.
    ([*TRIAL, "--gpus", "a"], "--gpus: a: expected GPU indices"),
    ([*TRIAL, "--gpus", "-1"], "--gpus: -1: expected distinct GPU indices"),
    ([*TRIAL, "--gpus", "0"], "--gpus: 0: the installed vLLM is the CPU build"),
    ([*TRIAL, "--gpus", "0", "--gpu", "0"], "--gpu: 0: give --gpus only (--gpu is its old spelling)"),
    ([*TRIAL, "--set", "max_num_seqs=64", "--set", "max_num_batched_tokens=8"],
     "--set: vLLM would refuse these flags: max_num_batched_tokens (8) must be >= max_num_seqs (64)"),
    ([*TRIAL, "--set", "gpu_memory_utilization=2"], "--set: vLLM would refuse these flags: gpu_memory_utilization"),
    ([*TRIAL, "--set", "gpu_memory_utilization=NaN"], "--set: gpu_memory_utilization: must be a finite number"),
    ([*TRIAL, "--set", "gpu_memory_utilization=Infinity"], "--set: gpu_memory_utilization: must be a finite"),
    ([*TRIAL, "--set", "max_num_seqs=-5"], "max_num_seqs (-5) must be >= 1"),
    ([*TRIAL, "--set", "max_num_seqs=0"], "max_num_seqs (0) must be >= 1"),
    ([*TRIAL, "--set", "max_num_seqs=1e20"], "--set: max_num_seqs: must be an integer"),
    ([*TRIAL, "--env", "VLLM_CPU_KVCACHE_SPACE=abc"], "--env: VLLM_CPU_KVCACHE_SPACE: vLLM reads it as an integer"),
    ([*TRIAL, "--env", "PYTHONPATH=/tmp/evil"], "--env: PYTHONPATH: names a path"),
    ([*TRIAL, "--set", "api_key=sk-s3cret"], "--set: api_key: cannot be set"),
    ([*TRIAL, "--boot-timeout", "nan"], "--boot-timeout"),
    (["estimate", "--model", "tiny:dense", "--set", "max_num_seqz=4"], "--set: max_num_seqz: vllm"),
    (["estimate", "--model", "tiny:dense", "--set", "max_num_seqs=0"], "max_num_seqs (0) must be >= 1"),
    (["estimate", "--model", "tiny:dense", "-n", "-1"], "-n: -1: must be between 0 and 1000"),
    (["estimate", "--model", "tiny:dense", "--vllm-version", "0.x"], "--vllm-version: 0.x: is not a vLLM version"),
    (["estimate", "--model", "tiny:dense", "-n", "100000000"], "-n: 100000000: must be between 0 and 1000"),
    (["estimate", str(QUICK / "quick.toml"), "--set", "max_num_seqs=4"], "--set: max_num_seqs=4: goes with --model"),
    (["status", "--study", "quick", "--limit", "0"], "--limit: 0: must be at least 1"),
    (["export", "--study", "quick", "--max-vram", "nan"], "--max-vram: nan: must be a positive number"),
    (["export", "--study", "quick", "--max-p95-ttft-ms", "-5"], "--max-p95-ttft-ms: -5.0: must be a positive"),
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


@pytest.mark.parametrize("kind", ["/dev/zero", "a FIFO"])
def test_a_study_file_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path: Path, kind: str) -> None:
    """/dev/zero was read until memory ran out, and a FIFO with no writer blocked `run` for ever."""
    path = Path("/dev/zero") if kind == "/dev/zero" else tmp_path / "study.toml"
    if kind == "a FIFO":
        os.mkfifo(path)
    out = CliRunner().invoke(main, ["run", str(path), "--n-trials", "1"])
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = out.exit_code == 2 and lines == [f"error: {path}: not a regular file"]
    LEDGER.append((f"bad input: run {kind}", survived, 0))
    assert survived, out.output


def test_a_study_file_too_large_to_be_one_is_refused(quick: Path) -> None:
    quick.write_text(QUICK_HEAD + "# " + "x" * (1 << 20) + "\n")
    out = CliRunner().invoke(main, ["run", str(quick), "--n-trials", "1"])
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = out.exit_code == 2 and len(lines) == 1 and "quick.toml: larger than 1 MiB" in lines[0]
    LEDGER.append(("bad input: a study file of more than 1 MiB", survived, 0))
    assert survived, out.output


@pytest.fixture()
def shared(quick: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, Path]:
    """A study as `autotune run --storage` leaves it in a shared database, its digest, and an empty worker host."""
    from autotune.config.study_file import load_study, stored_texts, study_digest
    from autotune.search.study import open_study

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = load_study(quick)
    open_study(spec, url)
    host = tmp_path / "host"
    host.mkdir()
    monkeypatch.chdir(host)
    return url, study_digest(*stored_texts(spec)), host


@pytest.mark.parametrize(("case", "named"), [
    ("--n-trials 0", "--n-trials: must be at least 1"),
    ("no digest", "--sha256: give the study's digest"),
    ("another digest", "--sha256: 0000000000000000: the stored study (sha256 "),
    ("a short digest", "--sha256: 00ab: expected the study's sha256"),
    ("another study file", "--study-file"),
])
def test_a_worker_refuses_before_writing_anything(shared: tuple[str, str, Path], quick: Path, case: str,
                                                 named: str) -> None:
    """A worker writes the stored study's files on its host only once its options hold and the study is the one it
    was given (by digest or as a file): whoever can write the shared database does not choose what runs here."""
    url, digest, host = shared
    other = quick.parent / "other.toml"
    other.write_text(quick.read_text().replace("seed = 1", "seed = 2"))
    extra = {"--n-trials 0": ["--sha256", digest, "--n-trials", "0"], "no digest": ["--n-trials", "1"],
             "another digest": ["--sha256", "0" * 16, "--n-trials", "1"],
             "a short digest": ["--sha256", "00ab", "--n-trials", "1"],
             "another study file": ["--study-file", str(other), "--n-trials", "1"]}[case]
    out = CliRunner().invoke(main, ["worker", "--study", "quick", "--storage", url, *extra])
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = out.exit_code == 2 and len(lines) == 1 and named in lines[0] and not list(host.iterdir())
    LEDGER.append((f"bad input: worker {case}", survived, 0))
    assert survived, out.output


@pytest.mark.parametrize("given", ["digest", "study file"])
def test_a_worker_given_the_study_rebuilds_it(shared: tuple[str, str, Path], quick: Path, given: str) -> None:
    from autotune.cli.search import trusted_digest
    from autotune.search.storage import spec_from_storage

    url, digest, host = shared
    trust = trusted_digest(digest[:12], None) if given == "digest" else trusted_digest(None, quick)
    spec = spec_from_storage("quick", url, host / ".autotune-worker" / "quick", trust)
    assert spec.name == "quick" and spec.path.read_text() == quick.read_text()


def test_a_host_allows_a_refused_variable_or_flag_by_name(quick: Path) -> None:
    """--allow-env and --allow-flag let the named ones through on this host, and no other."""
    from autotune.config.study_file import check_host_trust, load_study

    quick.write_text(QUICK_HEAD + "[engine]\ntrust_remote_code = true\n[engine.env]\nPYTHONPATH = '/opt/mine'\n")
    spec = load_study(quick)
    check_host_trust(spec, allow_flags=["trust_remote_code"], allow_env=["PYTHONPATH"])
    with pytest.raises(SpecError, match="engine.env.PYTHONPATH"):
        check_host_trust(spec, allow_flags=["trust_remote_code"], allow_env=["LD_PRELOAD"])
    with pytest.raises(SpecError, match="engine.trust_remote_code"):
        check_host_trust(spec, allow_flags=["middleware"], allow_env=["PYTHONPATH"])


def test_status_shows_control_characters_in_stored_names_instead_of_sending_them(tmp_path: Path) -> None:
    """A baseline name in a shared database (written by any client, not only through a checked study file) reaches
    the terminal with its escape sequences written out, not obeyed."""
    import optuna

    from autotune.search.storage import open_storage

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    study = optuna.create_study(study_name="quick", storage=open_storage(url), direction="maximize")
    name = "b\x1b]0;owned\x07\x1b[2J"
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={"baseline": {"name": name, "flags": {}}}))
    out = CliRunner().invoke(main, ["status", "--study", "quick", "--storage", url])
    survived = out.exit_code == 0 and "\x1b" not in out.output and "\x07" not in out.output
    LEDGER.append(("bad input: escape sequences in a stored baseline name", survived, 0))
    assert survived and "b\\x1b]0;owned\\x07" in out.output, out.output


def test_zz_bad_input_count(capsys: pytest.CaptureFixture[str]) -> None:
    refused = sum(ok for _, ok, _ in LEDGER)
    with capsys.disabled():
        print(f"\nbad input: {len(LEDGER)} cases, {refused} refused in one line with nothing written")
        for case, ok, _ in LEDGER:
            print(f"  {'ok  ' if ok else 'FAIL'} {case}")
    assert LEDGER and refused == len(LEDGER)
