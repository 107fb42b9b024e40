"""What the show tests check on a study, shared by the fast tests (a recorded study) and the engine test (a real
CPU run): the dashboard in Chromium, the report's page and PNGs, the notebook's outputs."""

from __future__ import annotations

import base64
import html
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import nbformat
import optuna
import pytest
from nbclient import NotebookClient

from autotune.search import record
from autotune.search.remeasure import best_trial
from autotune.show import page as report_page
from autotune.show import report

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
        overview = page.open(url, lambda text: name in text and "output_throughput" in text)
        assert name in overview and "output_throughput" in overview  # the study and its named objective
        trials_url = f"{url}/trials?numbers={best.number}"
        detail = page.open(trials_url, lambda text: "peak_memory_gib" in text and "vllm_command" in text)
        time.sleep(1)  # let the layout settle before the screenshot
        for attr in ("peak_memory_gib", "p95_ttft_ms", "vllm_command", "output_throughput"):
            assert attr in detail, f"user attribute {attr} not shown:\n{detail[:3000]}"
        missing = [t.number for t in study.trials if f"Trial {t.number}" not in detail]
        assert not missing, f"trials {missing} not listed"
        png = page.screenshot(screenshot)
    from PIL import Image

    image = Image.open(io.BytesIO(png))
    assert image.size[0] >= 1000 and len(set(image.convert("L").getdata())) > 10
    return detail


def load(db: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{db}")


def embedded_figures(page: str) -> dict[str, list[dict]]:
    """The traces of each figure, decoded from the `Plotly.newPlot("id", [traces], ...)` calls in the page."""
    decoder = json.JSONDecoder()
    return {m.group(1): decoder.raw_decode(page, m.end())[0]
            for m in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page)}


def check_report(study: optuna.Study, out: Path, png: bool = True) -> str:
    files = report_page.write_report(study, out, png=png)
    page = files.html.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", page), "the report must not load scripts from anywhere"
    assert not re.search(r"<link[^>]*href=\"?https?:", page)
    assert "Plotly" in page and len(page) > 3_000_000  # plotly.js is inline: the file opens offline
    for key in report.figures(study):
        assert f'id="{key}"' in page
    winner = report.best_trial(study)
    assert winner is not None
    best = winner.trial
    assert html.escape(best.user_attrs["vllm_command"]) in page  # the table gives the flags
    figs = embedded_figures(page)
    assert list(figs) == list(report.figures(study))
    hovers = [h for tr in figs["pareto_ttft"] for h in tr.get("hovertext") or []]
    for t in study.trials:  # every measured trial is in the Pareto plot's data, with its throughput
        v = record.view(t)
        if t.state.is_finished() and v.throughput is not None and v.p95_ttft_ms is not None:
            assert any(h.startswith(f"<b>trial {t.number}</b>") and f"{v.throughput:,.0f} output tok/s" in h
                       for h in hovers), f"trial {t.number} missing from the Pareto plot"
    best_trace = next(tr for tr in figs["pareto_ttft"] if tr["name"] == f"best: trial {best.number}")
    assert best_trace["y"] == [winner.figure]
    if png:
        from PIL import Image

        assert [p.name for p in files.pngs] == [f"{study.study_name}-pareto-latency.png",
                                                f"{study.study_name}-pareto-memory.png"]
        for path in files.pngs:
            image = Image.open(path).convert("RGB")
            assert image.size == (1100, 650)
            colours = image.getcolors(maxcolors=1 << 20)
            assert colours is not None and len(colours) > 50  # axes, text, markers: not a blank image
            # Green of the Pareto front and orange of the baselines are drawn.
            assert any(abs(r - 0x2C) < 30 and abs(g - 0xA0) < 30 and abs(b - 0x2C) < 30 for _, (r, g, b) in colours)
            assert any(abs(r - 0xFF) < 20 and abs(g - 0x7F) < 30 and b < 60 for _, (r, g, b) in colours)
    return page


NOTEBOOK = ROOT / "notebooks" / "explore_study.ipynb"


def run_notebook(db: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("AUTOTUNE_STUDY_DB", str(db))
    monkeypatch.delenv("AUTOTUNE_STUDY", raising=False)  # the notebook finds the only study in the database
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
                   ).execute()
    return nb


def outputs_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            data = out.get("data", {})
            parts.append(data.get("text/html", "") + data.get("text/plain", ""))
            parts.append(str(data.get("application/vnd.plotly.v1+json", "")))
    return "\n".join(parts)


def what_a_person_reads(study: optuna.Study, url: str, out: Path) -> dict[str, str]:
    """What a person reads of one study besides the run's summary: `status`, `export` (flags with its stderr,
    yaml, json), the report's page (written under `out`) and the dashboard's note on the study."""
    from click.testing import CliRunner
    from optuna_dashboard import get_note

    from autotune.cli import main
    from autotune.search.paired import save_answer_note

    runner = CliRunner()
    ref = ["--study", study.study_name, "--storage", url]
    got = {fmt: runner.invoke(main, ["export", *ref, "--format", fmt]) for fmt in ("flags", "yaml", "json")}
    for fmt, r in got.items():
        assert r.exit_code == 0, f"export --format {fmt}: {r.output}"
    texts = {f"export {fmt}": r.stdout + r.stderr for fmt, r in got.items()}
    texts["status"] = runner.invoke(main, ["status", *ref]).output
    texts["report"] = html.unescape(report_page.write_report(study, out, png=False).html.read_text())
    save_answer_note(study)
    texts["dashboard note"] = get_note(study)
    return texts


def check_one_answer(study: optuna.Study, texts: dict[str, str]) -> tuple[str, str, str]:
    """Every text names the same winner with the same figure (the `best:` line) and gives the same answer; every
    one but the exports (which carry the numbers in JSON) gives the latencies of the measurement the figure is;
    the JSON export's metrics are that measurement's. Returns (best line, figure line, answer sentence)."""
    from autotune.search import paired, remeasure

    trials = study.get_trials(deepcopy=False)
    winner = remeasure.best(trials)
    answer = paired.answer(study)
    assert winner is not None and answer is not None, "the study has no winner"
    best = f"best: {winner.text}"
    figure = remeasure.figure_line(winner, trials)
    for where, text in texts.items():
        flat = " ".join(text.split())
        assert best in flat, f"{where} does not give {best!r}:\n{text}"
        assert answer.sentence in flat, f"{where} does not give {answer.sentence!r}:\n{text}"
        if not where.startswith("export"):
            assert figure in flat, f"{where} does not give {figure!r}:\n{text}"
    metrics = json.JSONDecoder().raw_decode(texts["export json"])[0]["metrics"]  # stdout first, then stderr
    at = record.view(next(t for t in trials if t.number == winner.figure_trial))
    assert metrics["best"] == best and metrics["answer"] == answer.sentence
    if metrics["trial"] == winner.trial.number:  # the winner exported: its figure and that measurement's latencies
        assert (metrics["output_throughput"], metrics["figure_trial"]) == (round(winner.figure, 1), at.number)
        assert (metrics["p95_ttft_ms"], metrics["p95_tpot_ms"]) == (at.p95_ttft_ms, at.p95_tpot_ms)
    else:  # the best baseline exported instead, as the answer says
        assert not answer.proven and metrics["trial"] == answer.baseline_trial
    return best, figure, answer.sentence
