"""The exported command boots vLLM's CPU build exactly as printed: the `export --format flags` line in a shell, and
the YAML with the command its header says to serve it with (each given only a free port)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from processes import group_gone, within

from autotune.engine.flags import serve_command, serve_program
from autotune.engine.models import resolve_model
from autotune.show.export import to_yaml

EAGER = {"enforce_eager": True, "load_format": "dummy", "dtype": "float32", "max_num_seqs": 4}
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _served_models(port: int) -> list[str] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as reply:
            return [m["id"] for m in json.loads(reply.read())["data"]]
    except OSError:
        return None


def _boot_as_pasted(command: str, log: Path, cwd: Path) -> list[str]:
    """Run `command` as a user pastes it into a shell of the environment autotune runs in (its bin first on PATH),
    with a free port appended (it listens on 127.0.0.1 as printed); the models it serves once up. Stopped (its
    process group) after."""
    port = _free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    with log.open("w") as out:
        server = subprocess.Popen(["bash", "-c", f"{command} --port {port}"], stdout=out,
                                  stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    try:
        assert within(600, lambda: server.poll() is not None or _served_models(port) is not None), log.read_text()
        assert server.poll() is None, log.read_text()[-4000:]
        return _served_models(port) or []
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        if not group_gone(server.pid):
            os.killpg(server.pid, signal.SIGKILL)


def test_the_exported_flags_and_yaml_boot_the_cpu_build_as_printed(tmp_path: Path) -> None:
    model, defaults = resolve_model("tiny:dense")
    flags = {**defaults, **EAGER}
    command = serve_command(model, flags, ENV, serve_program())
    assert command.startswith("VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints.openai.api_server --model ")
    assert _boot_as_pasted(command, tmp_path / "flags.log", tmp_path) == [model]

    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(flags, model=model, env=ENV))
    header = [line[2:] for line in config.read_text().splitlines() if line.startswith("# ")]
    serve = next(line for line in header if line.startswith("serve it: ")).removeprefix("serve it: ")
    environment = " ".join(word for word in header if "=" in word and " " not in word)  # the header's NAME=value
    assert environment == "VLLM_CPU_KVCACHE_SPACE=1"
    pasted = f"{environment} {serve.replace('FILE', shlex.quote(str(config)))}"
    assert _boot_as_pasted(pasted, tmp_path / "yaml.log", tmp_path) == [model]
