"""The package as a user installs it by name: a wheel built from the checkout installs in a fresh virtual
environment and `autotune --help` runs from it. The wheel is installed without its dependencies, which come from
this environment (a .pth line), so the check takes seconds and needs no index."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _built_wheel(tmp: Path) -> Path:
    """The wheel pip builds from a copy of what the wheel is made of (the checkout stays free of build/)."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "autotune", src / "autotune", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, text=True)
    (wheel,) = (tmp / "dist").glob("*.whl")
    return wheel


def _fresh_venv(tmp: Path) -> Path:
    """A virtual environment with nothing installed, that sees this one's packages after its own."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                   "['purelib'])"], check=True, capture_output=True, text=True).stdout.strip())
    (purelib / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_the_wheel_installs_by_name_and_runs_autotune_help(tmp_path: Path) -> None:
    wheel = _built_wheel(tmp_path)
    assert wheel.name.startswith("vllm_autotune-")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata and any(n.endswith("licenses/LICENSE") for n in names)
    assert any(n.startswith("autotune/engine/known_models/") and n.endswith(".json") for n in names)

    venv = _fresh_venv(tmp_path)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}  # no PYTHONPATH: only what is installed
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, text=True, env=env, cwd=tmp_path)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import autotune; print(autotune.__file__)"],
                           check=True, capture_output=True, text=True, env=env, cwd=tmp_path).stdout
    assert where.startswith(str(venv)), where  # the wheel's copy, not the checkout's
    helped = subprocess.run([str(venv / "bin" / "autotune"), "--help"], capture_output=True, text=True, env=env,
                            cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "Usage: autotune" in helped.stdout and "export" in helped.stdout
    version = subprocess.run([str(venv / "bin" / "autotune"), "--version"], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert version.returncode == 0 and "version 0.1.0" in version.stdout, version.stderr  # read by the new name
