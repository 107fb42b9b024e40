"""A trial recorded under the old figure names reads as one recorded under vLLM bench's, with a notice."""

from __future__ import annotations

import optuna
from optuna.distributions import IntDistribution

from autotune import notices
from autotune.search.record import study_limits, view


def _study(attrs: dict, limits: dict) -> optuna.Study:
    study = optuna.create_study(study_name="old", direction="maximize")
    study.set_user_attr("limits", limits)
    study.add_trial(optuna.trial.create_trial(
        value=900.0, params={"max_num_seqs": 8}, distributions={"max_num_seqs": IntDistribution(1, 64)},
        user_attrs=attrs, system_attrs={"constraints": (0.0, 0.0)}))
    return study


def test_a_trial_recorded_under_the_old_names_reads_under_vllms(capsys, monkeypatch):
    monkeypatch.setattr(notices, "_said", set())  # each notice is said once per process: not yet in this test
    level = {"concurrency": 4, "passed": True, "output_tok_s": 900.0, "ttft_p95_ms": 300.0, "tpot_p50_ms": 9.0}
    study = _study({"output_tok_s": 900.0, "best_level": 4, "ttft_p95_ms": 300.0, "tpot_p95_ms": 20.0,
                    "levels": [level]}, {"ttft_p95_ms": 500.0})
    v = view(study.trials[0])
    assert (v.throughput, v.p95_ttft_ms, v.p95_tpot_ms, v.figures_recorded) == (900.0, 300.0, 20.0, True)
    assert v.levels[0]["output_throughput"] == 900.0 and v.levels[0]["p50_tpot_ms"] == 9.0
    assert study_limits(study) == {"p95_ttft_ms": 500.0}
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("notice: ") for line in err)  # one for the trials, one for limits
    view(study.trials[0])
    assert capsys.readouterr().err == ""  # said once


def test_a_trial_recorded_under_vllms_names_says_nothing(capsys):
    study = _study({"output_throughput": 900.0, "best_level": 4, "p95_ttft_ms": 300.0, "p95_tpot_ms": 20.0,
                    "levels": []}, {"p95_ttft_ms": 500.0})
    assert view(study.trials[0]).p95_ttft_ms == 300.0 and study_limits(study) == {"p95_ttft_ms": 500.0}
    assert capsys.readouterr().err == ""
