"""The dashboard for real: `autotune dashboard` serving optuna-dashboard, loaded in headless Chromium (driven through
the DevTools protocol), on a study recorded through the real study code and on one made by a real CPU run."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
from optuna_dashboard import get_note

from autotune.search.record import add_missing_notes, trial_note
from autotune.search.remeasure import best_trial
from autotune.search.storage import attach_log, find_artifact_store, open_artifact_store

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


class Page:
    """One Chromium tab over the DevTools protocol: just navigate, evaluate and screenshot."""

    def __init__(self, ws) -> None:
        self.ws, self.next_id = ws, 0

    def call(self, method: str, **params: object) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg["result"]

    def text(self) -> str:
        return self.call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''",
                         returnByValue=True)["result"].get("value", "")

    def wait_for(self, ok: Callable[[str], bool], timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            if ok(text) or time.monotonic() > deadline:
                return text
            time.sleep(0.5)

    def open(self, url: str, ok: Callable[[str], bool]) -> str:
        self.call("Page.navigate", url=url)
        return self.wait_for(ok)

    def screenshot(self, path: Path) -> bytes:
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return png


@contextmanager
def chromium_page(width: int = 1600, height: int = 1800) -> Iterator[Page]:
    from websockets.sync.client import connect

    profile = Path(tempfile.mkdtemp(prefix="autotune-chromium-"))
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             f"--window-size={width},{height}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            yield Page(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


@contextmanager
def dashboard_server(db: Path, name: str) -> Iterator[str]:
    """`autotune dashboard` on a free port; yields the study's address it prints."""
    argv = [str(Path(sys.executable).parent / "autotune"), "dashboard", "--storage", f"sqlite:///{db}",
            "--study", name, "--port", "0"]
    proc = subprocess.Popen(argv, cwd=db.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if "http://127.0.0.1:" in line:
                break
        else:
            raise AssertionError(f"no address printed: {proc.stderr.read()}")  # type: ignore[union-attr]
        yield line.split()[line.split().index(f"{name}:") + 1]
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0  # SIGTERM is a clean stop


def check_dashboard(db: Path, name: str, screenshot: Path) -> str:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    booted = [t for t in study.trials if "peak_memory_gib" in t.user_attrs]
    best = best_trial(study).trial if best_trial(study) else booted[0]  # a trial with every kind of user attribute
    with dashboard_server(db, name) as url, chromium_page() as page:
        overview = page.open(url, lambda text: name in text and "output_tok_s" in text)
        assert name in overview and "output_tok_s" in overview  # the study and its named objective
        trials_url = f"{url}/trials?numbers={best.number}"
        detail = page.open(trials_url, lambda text: "peak_memory_gib" in text and "vllm_command" in text)
        time.sleep(1)  # let the layout settle before the screenshot
        for attr in ("peak_memory_gib", "ttft_p95_ms", "vllm_command", "output_tok_s"):
            assert attr in detail, f"user attribute {attr} not shown:\n{detail[:3000]}"
        missing = [t.number for t in study.trials if f"Trial {t.number}" not in detail]
        assert not missing, f"trials {missing} not listed"
        png = page.screenshot(screenshot)
    from PIL import Image

    image = Image.open(io.BytesIO(png))
    assert image.size[0] >= 1000 and len(set(image.convert("L").getdata())) > 10
    return detail


@needs_chromium
def test_dashboard_shows_trials_attrs_notes_and_log(demo_study_db, tmp_path: Path) -> None:
    db, name = demo_study_db
    detail = check_dashboard(db, name, ARTIFACTS / "dashboard-demo.png")
    assert "trial-0002.log" in detail  # trial 2 (the best) has its server log attached as an artifact
    assert "Feasible: 1,500 output tok/s at concurrency 16" in detail  # its note, written when the dashboard started
    assert "--max-num-seqs 7" in detail


def test_trial_notes_say_the_result_in_words(demo_study_db) -> None:
    db, name = demo_study_db
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    assert add_missing_notes(study) == 8 and add_missing_notes(study) == 0  # written once, not rewritten
    t = {t.number: t for t in study.trials}
    assert get_note(optuna.Trial(study, t[0]._trial_id)).startswith(
        "**Feasible**: 900 output tok/s at concurrency 4 (p95 TTFT 300 ms, p95 TPOT 20.0 ms); peak 3.20 GiB host memory (RSS of the server's processes)"
        "\n\nBaseline **vllm-defaults**, booted as:\n\n```\nvllm serve tiny:dense \\\n  --load-format dummy")
    assert trial_note(t[4]).startswith("**Not feasible: missed the latency limits**. no load level met the limits")
    assert trial_note(t[6]).startswith("**Not feasible: rejected before boot**. predicted not to fit")
    assert "attached below" in get_note(optuna.Trial(study, t[2]._trial_id))
    assert "attached below" not in get_note(optuna.Trial(study, t[6]._trial_id))  # never booted: no log


def test_attach_log_before_tell_and_found_again(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    store = open_artifact_store(tmp_path / "s-artifacts")
    log = tmp_path / "s-artifacts" / "trial-0000.log"
    log.write_text("INFO ready\n")
    trial = study.ask()
    trial.set_user_attr("log_path", str(log))
    artifact_id = attach_log(study, trial, log, store)
    assert attach_log(study, trial, tmp_path / "missing.log", store) is None  # a server that never wrote a log
    study.tell(trial, 1.0)
    metas = optuna.artifacts.get_all_artifact_meta(study.trials[0], storage=study._storage)
    assert [(m.artifact_id, m.filename, m.mimetype) for m in metas] == [(artifact_id, "trial-0000.log", "text/plain")]
    found = find_artifact_store(study, f"sqlite:///{tmp_path / 's.db'}")
    assert found is not None
    with found.open_reader(artifact_id) as f:
        assert f.read() == b"INFO ready\n"


@pytest.mark.engine
@needs_chromium
def test_dashboard_on_a_real_cpu_study(cpu_study_db) -> None:
    db, name = cpu_study_db
    check_dashboard(db, name, ARTIFACTS / "dashboard.png")
