"""Objective files: the workload and the latency limits (at a percentile, named as vLLM names them) that define a
good configuration."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from autotune.config.toml import UNSET, TomlTable, build_dataclass, did_you_mean, read_toml
from autotune.errors import SpecError
from autotune.measure.datasets import read_dataset, read_request_log
from autotune.measure.ladder import LoadSearch
from autotune.measure.plan import Objective
from autotune.measure.stats import MAXIMIZE, OLD_NAMES, PERCENTILES, Limits, current_names, limit_key
from autotune.measure.workload import LengthDist, Workload
from autotune.notices import old_names_notice


def _length(t: TomlTable, name: str) -> LengthDist:
    v = t.get(name, UNSET)
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 1:
            raise t.error(name, f"must be >= 1, got {v}")
        return LengthDist(kind="fixed", mean=v, min=v, max=v)
    t.expect(name, isinstance(v, dict), "an integer or a table like { kind = \"normal\", mean = 512, std = 128 }", v)
    sub = TomlTable(v, t.source, t.key(name))
    dist = build_dataclass(LengthDist, sub)
    if dist.mean < 1 or dist.min < 1:
        raise sub.error("mean" if dist.mean < 1 else "min", "must be >= 1")
    if dist.std < 0:
        raise sub.error("std", f"must be >= 0, got {dist.std}")
    if dist.min > dist.max:
        raise sub.error("min", f"min ({dist.min}) must be <= max ({dist.max})")
    if not dist.min <= dist.mean <= dist.max:
        raise sub.error("mean", f"mean ({dist.mean}) must lie in [min, max] = [{dist.min}, {dist.max}]")
    return dist


def _check_workload(workload: Workload, wt: TomlTable) -> None:
    """What the workload's values mean together, and its dataset or request log read and checked line by line:
    a bad line is said now, before a server boots (the token lengths against the model: config/workload_checks.py)."""
    if workload.shared_prefix_len < 0:
        raise wt.error("shared_prefix_len", f"must be >= 0, got {workload.shared_prefix_len}")
    if workload.seed < 0:  # numpy's generators take none (a ValueError in the first trial's requests)
        raise wt.error("seed", f"must be >= 0, got {workload.seed}")
    if workload.turns < 1:
        raise wt.error("turns", f"must be >= 1, got {workload.turns}")
    if workload.dataset is not None and workload.replay is not None:
        raise wt.error("replay", "give either 'dataset' (prompts) or 'replay' (a request log), not both")
    if workload.turns > 1 and (workload.dataset is not None or workload.replay is not None):
        raise wt.error("turns", "conversations are drawn: 'turns' > 1 goes with neither 'dataset' nor 'replay'")
    if workload.clip_to_context and (workload.dataset is not None or workload.replay is not None
                                     or workload.turns > 1):
        raise wt.error("clip_to_context", "cuts drawn prompts: it goes with neither 'dataset', 'replay' nor "
                                          "'turns' > 1")
    if workload.dataset is not None:
        read_dataset(workload.dataset)
    if workload.replay is not None:
        read_request_log(workload.replay)


def load_objective(path: str | Path) -> Objective:
    """Read and validate an objective file."""
    source = str(path)
    path = Path(path)
    top = TomlTable(read_toml(path, source), source)
    name = top.label("name", path.stem)
    description = top.label("description", "", lines=True)
    maximize = top.text("maximize", "output_throughput")
    if maximize not in MAXIMIZE:
        raise top.error("maximize", f"must be one of {', '.join(map(repr, MAXIMIZE))}, got {maximize!r}"
                        + did_you_mean(maximize, MAXIMIZE))

    wt = top.table("workload", required=True)

    def data_file(key: str) -> Path:
        p = (path.parent / wt.text(key)).resolve()
        if not p.is_file():
            raise wt.error(key, f"file not found: {p}")
        return p

    workload = build_dataclass(Workload, wt, {"input_len": lambda k: _length(wt, k),
                                              "output_len": lambda k: _length(wt, k),
                                              "dataset": data_file, "replay": data_file})
    _check_workload(workload, wt)

    lt = top.table("limits", required=True)
    lt.data, old = current_names(lt.data)
    old_names_notice(f"{source}: [limits]", old, OLD_NAMES)
    limits = build_dataclass(Limits, lt)
    set_limits = limits.set()
    if not set_limits:
        raise lt.error(None, "set at least one limit, e.g. p95_ttft_ms or p99_tpot_ms (p50/p90/p95/p99 of ttft, "
                             "tpot, itl or e2el, in ms) or joules_per_token")
    for k, v in set_limits.items():
        if v <= 0:
            raise lt.error(k, f"must be > 0, got {v}")

    ld = top.table("load")
    load = build_dataclass(LoadSearch, ld)
    if workload.replay is not None and load.mode != "rate":
        raise ld.error("mode", 'a replayed log needs mode = "rate": its arrival times are scaled to each level\'s '
                               "rate (the level at the log's own mean rate replays it as recorded)")
    checks = [("start", load.start > 0, "must be > 0"), ("max", load.max >= load.start, "must be >= start"),
              ("factor", load.factor > 1, "must be > 1"), ("tolerance", load.tolerance > 0, "must be > 0"),
              ("min_requests", load.min_requests >= 1, "must be >= 1"),
              ("warmup_requests", load.warmup_requests >= 0, "must be >= 0"),
              ("p95_margin", load.p95_margin >= 0, "must be >= 0 (0: a fixed count of min_requests)"),
              ("p95_confidence", 0 < load.p95_confidence < 1, "must lie between 0 and 1"),
              ("max_requests", load.max_requests >= 1, "must be >= 1"),
              ("verdict_error", 0 <= load.verdict_error < 0.5, "must lie in [0, 0.5) (0: no early verdicts)")]
    for key, ok, message in checks:
        if not ok:
            raise ld.error(key, f"{message}, got {getattr(load, key)}")
    top.done()
    return Objective(name=name, path=path, description=description, workload=workload, limits=limits, load=load,
                     maximize=maximize)


# `--goodput KEY:MS ...` as `vllm bench serve` takes it (ttft, tpot, e2el; itl too), each judged at autotune's p95;
# pNN_KEY (p50, p90, p95, p99) for another percentile, as the limit's name in an objective file says it.
GOODPUT_KEY = re.compile(r"(?:p(\d+)_)?(ttft|tpot|itl|e2el)(?:_ms)?")
GOODPUT_FORM = ("expected KEY:MS, KEY one of ttft, tpot, itl, e2el (judged at p95) or pNN_KEY at another percentile "
                "(p50, p90, p95, p99), MS a number of milliseconds > 0; e.g. --goodput ttft:2000 p99_tpot:100")


def goodput_limits(items: Sequence[str]) -> Limits:
    """The limits of `--goodput ttft:2000 p99_tpot:100` (a bad item: a one-line error naming it)."""
    limits: dict[str, float] = {}
    for item in items:
        key, _, ms = item.partition(":")
        match = GOODPUT_KEY.fullmatch(key.strip().lower())
        try:
            value = float(ms)
        except ValueError:
            value = math.nan
        percentile = int(match[1] or 95) if match else None
        if match is None or percentile not in PERCENTILES or not (math.isfinite(value) and value > 0):
            raise SpecError("--goodput", item, GOODPUT_FORM)
        name = limit_key(percentile, match[2])
        if name in limits:
            raise SpecError("--goodput", item, f"{name} is given twice")
        limits[name] = value
    return Limits(**limits)
