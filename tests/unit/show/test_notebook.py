"""The analysis notebook runs top to bottom (nbclient, a real kernel) against a study database."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
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


def test_notebook_runs_on_a_recorded_study(demo_study_db, monkeypatch) -> None:
    db, name = demo_study_db
    text = outputs_text(run_notebook(db, name, monkeypatch))
    assert f"study {name}: 8 trials" in text
    assert "+67%" in text and "+36%" in text  # best (1,500 tok/s) against vllm-defaults (900) and recipe (1,100)
    assert "max_num_seqs" in text  # the importances


@pytest.mark.engine
def test_notebook_runs_on_a_real_cpu_study(cpu_study_db, monkeypatch) -> None:
    db, name = cpu_study_db
    text = outputs_text(run_notebook(db, name, monkeypatch))
    assert f"study {name}:" in text
    # every baseline has its row, also when it is the best trial itself ("best = baseline ...")
    assert "baseline vllm-defaults" in text and "baseline recipe" in text
