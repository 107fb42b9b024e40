"""A recorded response surface (benchmarks/record_surface.py): what each configuration did at each rung of a load
ladder, read back for replay without booting anything.

Two file layouts are read. The CPU grid (benchmarks/data/cpu-tiny-grid/surface.json) keeps max_num_seqs and
max_num_batched_tokens at the top of each configuration; a planned surface (`"format": 2`, the GPU plan) keeps a
`params` dict per configuration, the searched space and the baselines in its provenance, and the estimator's
verdict per configuration (`refused`: what autotune would refuse before boot). Every rung keeps its requests'
timings, so a tighter p95 limit can be judged again from them (a looser one cannot: the ladder stopped at the
first miss under the recorded limits).

Which rungs a configuration has under given limits (`_rungs`): those autotune's load search would measure from the
recorded `start` (the GPU surface's: where the recorder's walk began, near the configuration's capacity; the CPU
grid's and older files': their lowest level): up from it while a rung passes, or down from it while one fails.
What the replay assumes about levels it has no record of: above a rung that misses, every level misses; below one
that passes, every level passes (the search's own assumption). The GPU recorder measured down to a rung that meets
its `tightest_limits` (or concurrency 1), so limits between those and the recorded ones never need an unmeasured
level; tighter ones are refused. A rung the recording failed fails any tighter limits whatever its records say (an
abandoned rung's records are its first requests and the lower bounds of those it dropped).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune.config.params import Param, same_value
from autotune.measure.client import LevelRun, LoadLevel, RequestRecord
from autotune.measure.stats import Limits, judge, level_stats, read_limits

BISECTION_LEVELS = 2
# studies/tiny-cpu.toml's baselines, for the CPU grid (which predates stored baselines): vLLM's CPU defaults and
# the recipe, snapped to the grid
CPU_GRID_BASELINES = (("vllm-defaults", 128, 2048), ("recipe", 16, 1024))


@dataclass(frozen=True)
class Rung:
    concurrency: int
    passed: bool
    output_tok_s: float
    misses: dict[str, float]
    duration_s: float


@dataclass(frozen=True)
class Point:
    """One configuration as recorded: refused by the estimator or vLLM, failed to boot, or measured rung by rung."""

    params: dict[str, object]
    status: str  # "measured" | "boot_failed" | "died"
    refused: str | None  # why autotune refuses it before boot (the estimator or vLLM's argument checks), else None
    rungs: tuple[Rung, ...]
    boot_s: float
    wall_s: float
    baseline: str | None = None  # the baseline's name when this configuration is one
    # Per level, the recorded wall time that was neither boot nor a level's requests (warm-ups, stop), over every
    # level recorded, also those a search under other limits would not measure. None: over `rungs`.
    overhead_s: float | None = None
    flags: dict[str, object] | None = None  # the flags it booted with (a planned surface's), for checks before boot

    @property
    def key(self) -> tuple[tuple[str, object], ...]:
        return tuple(sorted(self.params.items()))

    @property
    def value(self) -> float:
        """Throughput of the highest passing rung (the search stopped at the first miss); 0 when none passed."""
        passing = [r for r in self.rungs if r.passed]
        return max(passing, key=lambda r: r.concurrency).output_tok_s if passing and self.status == "measured" \
            else 0.0

    @property
    def feasible(self) -> bool:
        """It boots and meets the limits at some rung. A configuration the estimator refuses but that ran is
        feasible: refusing it is the estimator's loss, which the replay counts."""
        return self.value > 0

    def schedule(self) -> list[tuple[float, float]]:
        """(value reported to the pruner, engine seconds) per load level the real search would measure: the
        rungs in the search's order, then, when one passed and the next one up failed, the 2 bisection levels
        autotune's SLA search adds between them (factor 2, tolerance 0.25; not recorded: each costs the mean of the
        two rungs, and reports the best passing figure so far). Each rung also carries its share of the recorded
        wall time that was neither boot nor measurement (warm-ups, stop)."""
        if not self.rungs:
            return []
        overhead = self._overhead_per_level()
        out: list[tuple[float, float]] = []
        top: Rung | None = None  # the highest passing rung so far: its throughput is the value reported
        for r in self.rungs:
            top = r if r.passed and (top is None or r.concurrency > top.concurrency) else top
            out.append((top.output_tok_s if top else 0.0, r.duration_s + overhead))
        best = out[-1][0]
        above = [r for r in self.rungs if not r.passed and top is not None and r.concurrency > top.concurrency]
        if top is not None and above:
            miss = min(above, key=lambda r: r.concurrency)
            out += [(best, (top.duration_s + miss.duration_s) / 2 + overhead)] * BISECTION_LEVELS
        return out

    def best_level(self) -> int | None:
        """The concurrency of the highest passing rung: the level a study's incumbent is screened at."""
        passing = [r.concurrency for r in self.rungs if r.passed]
        return max(passing) if passing and self.status == "measured" else None

    def passes_at(self, level: int) -> bool | None:
        """Whether it meets the limits at `level`, as every search assumes: a level at or below a passing rung
        passes, one at or above a failing rung fails. None where the rungs say neither."""
        if any(r.passed and r.concurrency >= level for r in self.rungs):
            return True
        if any(not r.passed and r.concurrency <= level for r in self.rungs):
            return False
        return None

    def screened_cost_s(self, level: int) -> float:
        """Engine seconds to boot it and fail `level`: the rung recorded there, else the highest failing rung
        below it (on the GPU surface an abandoned level: ~5 s), each with its share of the overhead."""
        failing = [r for r in self.rungs if not r.passed and r.concurrency <= level]
        rung = max(failing, key=lambda r: r.concurrency)
        return self.boot_s + rung.duration_s + self._overhead_per_level()

    def _overhead_per_level(self) -> float:
        """Each measured level's share of the wall time that was neither boot nor a level's requests."""
        if self.overhead_s is not None:
            return self.overhead_s
        return max(0.0, self.wall_s - self.boot_s - sum(r.duration_s for r in self.rungs)) / len(self.rungs)

    def cost_s(self, levels: int | None = None) -> float:
        """Engine seconds to boot it and measure its first `levels` load levels (all by default); a configuration
        that did not boot costs its recorded wall time (boot until the failure was classified, and the stop)."""
        if not self.rungs:
            return self.wall_s
        return self.boot_s + sum(c for _, c in self.schedule()[:levels])


@dataclass(frozen=True)
class Surface:
    points: tuple[Point, ...]
    space: tuple[Param, ...]
    provenance: dict[str, object] = field(hash=False)
    # what the recorded vLLM used for a searched flag a configuration leaves unset (vllm_decides): a baseline that
    # leaves prefix caching to vLLM is the configuration that names vLLM's choice, not one a parameter away
    unset: Mapping[str, object] = field(default_factory=dict, hash=False)

    @property
    def best(self) -> float:
        return max(p.value for p in self.points if p.feasible)

    @property
    def baselines(self) -> list[Point]:
        """In the order the study queues them: its file's order (for the CPU grid, CPU_GRID_BASELINES')."""
        order = [b.get("name") if isinstance(b, dict) else b for b in self.provenance.get("baselines") or []]
        order = order or [n for n, _, _ in CPU_GRID_BASELINES]
        found = [p for p in self.points if p.baseline is not None]
        return sorted(found, key=lambda p: order.index(p.baseline) if p.baseline in order else len(order))

    def nearest(self, params: Mapping[str, object], among: Callable[[Point], bool] | None = None) -> Point:
        """The recorded configuration closest to a sampled one: per parameter, the distance in the space's scale
        (log where the parameter is log) over its range, 1 for a different category or a parameter only one side
        has (a flag left to vLLM counts as the value vLLM gave it: `unset`); ties go to the larger numbers (as the
        grid snapping did: ties go up). `among`: only the recorded ones it accepts (all, where it accepts none)."""
        def rank(p: Point) -> tuple[float, tuple[float, ...]]:
            return (round(distance(self.space, params, p.params, self.unset), 9),
                    tuple(-float(v) for _, v in p.key if isinstance(v, int | float) and not isinstance(v, bool)))
        candidates = [p for p in self.points if among is None or among(p)]
        return min(candidates or self.points, key=rank)

    def auto_tune_order(self) -> list[Point]:
        """vLLM's benchmarks/auto_tune/auto_tune.sh order: max_num_seqs outer, max_num_batched_tokens inner, each
        as its list is written (ascending in the script's defaults); the other parameters, which the script does
        not search, break ties in the space's order."""
        first = ("max_num_seqs", "max_num_batched_tokens")
        names = [*first, *(p.name for p in self.space if p.name not in first)]
        return sorted(self.points, key=lambda p: tuple(_sortable(p.params.get(n)) for n in names))


def _sortable(v: object) -> tuple[int, float, str]:
    if v is None:
        return (0, 0.0, "")
    if isinstance(v, int | float) and not isinstance(v, bool):
        return (1, float(v), "")
    return (2, 0.0, str(v))


def distance(space: tuple[Param, ...], a: Mapping[str, object], b: Mapping[str, object],
             unset: Mapping[str, object] | None = None) -> float:
    """`unset`: the value a parameter takes where a side leaves it out (vLLM's choice for a flag)."""
    if unset:
        a, b = {**unset, **a}, {**unset, **b}
    total = 0.0
    for p in space:
        if p.name not in a and p.name not in b:
            continue
        if p.name not in a or p.name not in b:
            total += 1.0
        elif p.type in ("int", "float"):
            scale = math.log if p.log else float
            lo, hi = scale(float(p.low)), scale(float(p.high))  # type: ignore[arg-type]
            x, y = (scale(max(float(v), float(p.low))) for v in (a[p.name], b[p.name]))  # type: ignore[arg-type]
            total += abs(x - y) / ((hi - lo) or 1.0)
        else:
            total += 0.0 if same_value(a[p.name], b[p.name]) else 1.0
    return total


def level_records(level: dict, key: str = "records") -> list[RequestRecord]:
    """A recorded rung's requests as the client saw them (record_surface.compact: times from the rung's start);
    `key` "dropped": those an abandoned rung cancelled, as far as they got."""
    return [RequestRecord(r[0], r[1], [], r[2], 0, r[3], r[4]) for r in level.get(key, [])]


def rejudge(level: dict, limits: Limits) -> tuple[bool, dict[str, float]]:
    """A recorded rung's verdict under other (tighter) limits, from its per-request records (metrics.judge, as
    the recording judged it). A rung the recording failed fails them too, with its recorded misses."""
    if not level["passed"]:
        return False, dict(level.get("misses", {}))
    run = LevelRun(LoadLevel("concurrency", level["concurrency"]), level_records(level), 0.0, level["duration_s"],
                   dropped=tuple(level_records(level, "dropped")))
    verdict = judge(level_stats(run, limits), limits)
    return verdict.passed, verdict.misses


def judged(level: dict, limits: Limits | None) -> tuple[bool, dict[str, float]]:
    """A recorded rung's verdict and misses: as recorded (limits None), or judged again under `limits` (rejudge)."""
    return (level["passed"], level.get("misses", {})) if limits is None else rejudge(level, limits)


def _rungs(levels: list[dict], limits: Limits | None, start: int | None = None) -> tuple[Rung, ...]:
    """The rungs a load search from `start` (default: the lowest recorded) measures, in its order, judged as
    recorded or under `limits`: up the recorded levels while they pass, or down while they fail."""
    if not levels:
        return ()
    by_level = {lv["concurrency"]: lv for lv in levels}  # one record per level
    order = sorted(by_level)
    i = order.index(start) if start in by_level else 0

    def rung(c: int) -> Rung:
        lv = by_level[c]
        passed, misses = judged(lv, limits)
        return Rung(c, passed, lv["output_tok_s"], misses, lv["duration_s"])

    out = [rung(order[i])]
    step = 1 if out[0].passed else -1
    j = i + step
    while 0 <= j < len(order) and out[-1].passed == out[0].passed:
        out.append(rung(order[j]))
        j += step
    return tuple(out)


def _overhead(c: dict, boot_s: float) -> float | None:
    """Point.overhead_s of a recorded configuration: its wall time less its boots and every level it recorded."""
    levels = c.get("levels") or []
    return max(0.0, c["wall_s"] - boot_s - sum(lv["duration_s"] for lv in levels)) / len(levels) if levels else None


def params_key(params: Mapping[str, object]) -> str:
    """A configuration's identity, key order aside."""
    return json.dumps(params, sort_keys=True)


def entry_params(c: dict) -> dict[str, object]:
    """A recorded configuration's params in either layout (the CPU grid keeps its two flags at the top)."""
    return c.get("params") or {k: c[k] for k in ("max_num_seqs", "max_num_batched_tokens")}


def config_key(c: dict) -> str:
    return params_key(entry_params(c))


def _nearest_on_axis(axis: list[int], v: float) -> int:
    return min(axis, key=lambda a: (abs(math.log2(a) - math.log2(v)), -a))


def _read_grid(doc: dict, limits: Limits | None) -> tuple[tuple[Point, ...], tuple[Param, ...]]:
    """The CPU grid's layout: the two searched flags at the top of each configuration, `precheck` for refused."""
    seqs = sorted({c["max_num_seqs"] for c in doc["configs"]})
    tokens = sorted({c["max_num_batched_tokens"] for c in doc["configs"]})
    names = {(_nearest_on_axis(seqs, s), _nearest_on_axis(tokens, b)): n for n, s, b in CPU_GRID_BASELINES}
    points = tuple(
        Point({"max_num_seqs": c["max_num_seqs"], "max_num_batched_tokens": c["max_num_batched_tokens"]},
              c["status"], c.get("precheck"), _rungs(c.get("levels", []), limits), c.get("boot_s", 0.0), c["wall_s"],
              names.get((c["max_num_seqs"], c["max_num_batched_tokens"])), _overhead(c, c.get("boot_s", 0.0)))
        for c in doc["configs"])
    space = tuple(Param(name, "int", low=min(axis), high=max(axis), log=True)
                  for name, axis in (("max_num_seqs", seqs), ("max_num_batched_tokens", tokens)))
    return points, space


def _read_planned(doc: dict, limits: Limits | None) -> tuple[tuple[Point, ...], tuple[Param, ...]]:
    """A planned surface's layout. A configuration booted twice (`cold_boot`: cold, then warm; or given the
    estimate's KV blocks, then sized by vLLM) cost both boots, as such a trial does. Its walk began at `start`."""
    space = tuple(Param(**{**d, "choices": tuple(d.get("choices", ()))}) for d in doc["provenance"]["space"])

    def boots(c: dict) -> float:
        return c.get("boot_s", 0.0) + c.get("cold_boot", {}).get("boot_s", 0.0)

    def refused(c: dict) -> str | None:
        """The verdict of the estimator on the device (`estimate_now`), the one an autotune trial there meets, with
        the flags it booted. The plan's `estimate` is for the study's flags alone, and the first plan's was judged
        with the CPU build here, without the capture-size pin vLLM 0.25.0's CUDA build gets (record_surface.
        device_vllm): 14 of the 42 refused where the device refused 23. Against the "Available KV cache memory"
        the five refused configurations' warm boots printed (2.35, -0.95, -0.09, 1.29, -0.25 GiB), the device's
        estimates were 0.07-0.30 GiB lower; the CPU build's 0.22-0.62 GiB higher for four of them."""
        now = c.get("estimate_now")
        if now is None:
            return c.get("refused")
        return (now.get("reason") or "refused") if now.get("refused") else None

    points = tuple(
        Point(dict(c["params"]), c["status"], refused(c), _rungs(c.get("levels", []), limits, c.get("start")),
              boots(c), c["wall_s"], c.get("baseline"), _overhead(c, boots(c)), c.get("flags"))
        for c in doc["configs"] if c["status"] != "pending")
    return points, space


def load_surface(path: Path, limits: Limits | None = None, repeated: bool = False) -> Surface:
    """The recorded surface; with `limits`, each rung judged again under them: no looser than the recording's
    (above a rung the recording failed nothing was measured), and no tighter than its `tightest_limits`, where it
    names them (below the lowest rung of each configuration nothing was). `repeated`: each configuration measured
    again (the file's `repeats`) as its latest measurement has it, the surface another run would have replayed."""
    doc = json.loads(path.read_text())
    if repeated:
        again = {config_key(c): c for c in doc.get("repeats", [])}
        doc["configs"] = [again.get(config_key(c), c) for c in doc["configs"]]
    recorded = read_limits(doc["provenance"].get("limits", {})).set()  # recorded before vLLM's names
    tightest = read_limits(doc["provenance"].get("tightest_limits", {})).set()
    if limits is not None:
        for key, value in dataclasses.asdict(limits).items():
            if value is not None and recorded.get(key) is not None and value > recorded[key]:
                raise ValueError(f"{key}: {value} is looser than the recorded {recorded[key]}")
            if value is not None and tightest.get(key) is not None and value < tightest[key]:
                raise ValueError(f"{key}: {value} is tighter than the {tightest[key]} the surface was recorded down "
                                 "to (no level below each configuration's lowest was measured)")
    points, space = (_read_planned if doc.get("format") == 2 else _read_grid)(doc, limits)
    if not any(p.feasible for p in points):
        raise ValueError(f"{path}: no recorded configuration meets the limits")
    provenance = dict(doc.get("provenance", {}))
    unset = vllm_decides(space, str(provenance.get("model") or ""), provenance.get("vllm"))
    if limits is not None:
        provenance["limits"] = limits.set()
        provenance["rejudged"] = f"rungs judged again under these limits (recorded under {recorded})"
    return Surface(points, space, provenance, unset)


def vllm_decides(space: tuple[Param, ...], model: str, vllm_version: object) -> dict[str, object]:
    """The searched flags without a default of the space's own (vLLM decides) and without a condition, with the
    value the recorded vLLM gives them when unset (engine/defaults.py unset_flag_value) for this model."""
    from autotune.engine.defaults import unset_flag_value
    from autotune.fit.feasibility import model_shape

    free = [p.name for p in space if p.default is None and not p.when and p.type == "bool"]
    if not free or not model:
        return {}
    hybrid = model_shape(model).is_hybrid
    values = {name: unset_flag_value(name, str(vllm_version) if vllm_version else None, hybrid) for name in free}
    return {name: v for name, v in values.items() if v is not None}


def space_as_json(space: tuple[Param, ...] | list[Param]) -> list[dict[str, object]]:
    """The searched parameters as a planned surface stores them (read back by _read_planned)."""
    return [{**dataclasses.asdict(p), "choices": list(p.choices)} for p in space]


def measurements(path: Path, limits: Limits | None = None) -> dict[str, list[float]]:
    """Each recorded configuration's figures (its value under `limits`) by params_key: the first record, then
    each of the file's `repeats` of it in order. A re-measurement in the replay takes them in turn."""
    doc = json.loads(path.read_text())
    read = _read_planned if doc.get("format") == 2 else _read_grid
    out = {params_key(p.params): [p.value] for p in read(doc, limits)[0]}
    for again in doc.get("repeats", []):
        (point,), _ = read({**doc, "configs": [again]}, limits)
        out.setdefault(params_key(point.params), []).append(point.value)
    return out
