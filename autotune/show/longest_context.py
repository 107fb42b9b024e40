"""The long-context answer: for 1, 2 and 4 concurrent users, the longest max_model_len that booted and served the
objective within its limits, with the trial and the flags that did it.

It is read off the recorded trials of a study whose objective cuts its prompts to each trial's context
(`clip_to_context`): there a trial with a longer context was sent longer prompts, so a level it passed at N users is
N users served at that length. A trial that ran out of memory or crashed while serving does not count, whatever
levels it passed before: those flags, deployed, die once the long prompt comes. Concurrency levels only: a rate
says nothing of how many users are in flight.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from autotune.engine.flags import to_argv
from autotune.search.record import BUDGET_END, MEASURED, MISSED_LIMITS, SCREENED_OUT, TrialView, views
from autotune.search.storage import stored_files

USERS = (1, 2, 4)

# The endings of a trial whose passed levels stand: it served them and was not seen to fail afterwards.
_SERVED = (MEASURED, MISSED_LIMITS, SCREENED_OUT, BUDGET_END)


@dataclass(frozen=True)
class LongestContext:
    """The longest context served at `users` concurrent users within the limits; `trial` None: not found."""

    users: int
    max_model_len: int | None = None
    trial: int | None = None
    level: float | None = None  # the highest concurrency that trial met the limits at
    flags: tuple[str, ...] = ()  # its vLLM flags as booted, as command-line words

    @property
    def text(self) -> str:
        who = f"{self.users} user" + ("s" if self.users > 1 else "")
        if self.trial is None:
            return f"{who}: not found"
        return (f"{who}: {self.max_model_len:,} tokens (trial {self.trial}, met the limits up to concurrency "
                f"{self.level:g}): {' '.join(self.flags)}")


def clips_to_context(study: optuna.Study) -> bool:
    """Whether the study's objective, as stored with it, sends prompts cut to each trial's context."""
    objective = (stored_files(study) or {}).get("objective")
    if not objective:
        return False
    return tomllib.loads(objective).get("workload", {}).get("clip_to_context") is True


def longest_contexts(trials: Sequence[TrialView], users: Sequence[int] = USERS) -> list[LongestContext]:
    """For each number of users, the longest context among trials that served it (ties: the earlier trial)."""
    served = [(context, v, top) for v in trials if (context := _context(v)) and (top := _highest_passed(v))]
    answers = []
    for n in users:
        at_n = [(context, -v.number, v, top) for context, v, top in served if top >= n]
        if not at_n:
            answers.append(LongestContext(n))
            continue
        context, _, v, top = max(at_n, key=lambda s: s[:2])
        answers.append(LongestContext(n, context, v.number, top, tuple(to_argv(v.flags or {}))))
    return answers


def context_lines(study: optuna.Study) -> list[str]:
    """What `run`, `status` and the report print: the answer per number of users, where the study asks it."""
    if not clips_to_context(study):
        return []
    return ["longest context served within the limits:",
            *(f"  {answer.text}" for answer in longest_contexts(views(study)))]


def _context(v: TrialView) -> int | None:
    context = (v.flags or {}).get("max_model_len")
    return context if isinstance(context, int) and v.ending in _SERVED else None


def _highest_passed(v: TrialView) -> float | None:
    """The highest concurrency level the trial met the limits at (None: none, or its levels were rates)."""
    passed = [level for lv in v.levels if lv.get("passed") and (level := lv.get("concurrency")) is not None]
    return max(passed, default=None)
