"""The out-of-sample surface's plan (benchmarks/long_context_plan.py): a space-filling design of the opened space,
frozen as drawn (the estimator moves on; its verdicts in the file are those it was drawn with), that holds no search
method's proposal."""

from __future__ import annotations

import json

from scipy.stats import qmc

from benchmarks import long_context_plan as lcp
from benchmarks.surface_plan import from_unit


def test_the_plan_is_the_sobol_sequence_of_the_opened_space_and_holds_no_methods_proposal() -> None:
    doc = json.loads(lcp.PLAN.read_text())
    configs = doc["configs"]
    origins = [c["origin"] for c in configs]
    assert origins.count("baseline") == 2 and origins.count("sobol") == lcp.POINTS >= 30
    assert origins.count("sobol-refused") == lcp.REFUSED and "pick" not in origins
    assert all(not c["estimate"]["refused"] for c in configs if c["origin"] == "sobol")
    assert all(c["estimate"]["refused"] for c in configs if c["origin"] == "sobol-refused")
    _, space, _ = lcp.planned_for()
    spec = {p["name"]: p for p in doc["space"]}
    assert (spec["max_num_seqs"]["low"], spec["max_num_seqs"]["high"]) == (1, 64)
    assert (spec["gpu_memory_utilization"]["low"], spec["gpu_memory_utilization"]["high"]) == (0.88, 0.97)
    assert set(spec["max_model_len"]["choices"]) >= {32768, 262144} and "model" not in spec
    # each drawn configuration is a point of the seeded Sobol sequence over that space, in the sequence's order
    units = qmc.Sobol(d=len(space), scramble=True, seed=lcp.SEED).random_base2(10)
    sequence = [from_unit(space, list(u)) for u in units]
    for origin in ("sobol", "sobol-refused"):
        at = [sequence.index(c["params"]) for c in configs if c["origin"] == origin]
        assert at == sorted(at), origin
    # space-filling: every value of each categorical axis appears among the 40 Sobol points
    sobol = [c["params"] for c in configs if c["origin"].startswith("sobol")]
    for name in ("max_model_len", "kv_cache_dtype", "max_num_batched_tokens", "speculative_method"):
        assert {str(c[name]) for c in sobol} == {str(v) for v in spec[name]["choices"]}, name
