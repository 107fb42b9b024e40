"""What a person sees while a study runs: the trial and its stage, the best so far, trials done, time left."""

from __future__ import annotations

from optuna.trial import TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner
from rich.text import Text

from autotune.budget import Budget
from autotune.remeasure import Best


def _hms(seconds: float) -> str:
    if seconds == float("inf"):
        return "no time limit"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class LiveProgress:
    """A live status block (one line per running trial) above the finished trials' one-line summaries;
    plain lines when the output is not a terminal."""

    def __init__(self, console: Console, budget: Budget):
        self.console, self.budget = console, budget
        self.running: dict[int, list[str]] = {}  # trial number -> [label, slot, stage]
        self.best: Best | None = None
        self.done = 0
        self._live = Live(console=console, refresh_per_second=4, transient=True, get_renderable=self._render)

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.console.is_terminal:
            self._live.__exit__(None, None, None)

    def _render(self) -> Group:
        best = f"{self.best.figure:,.0f} tok/s (trial {self.best.trial.number})" if self.best else "none feasible yet"
        lines = [Text(f"best {best}  ·  {self.done} done  ·  {_hms(self.budget.remaining())} left", style="bold")]
        for number, (label, slot, stage) in sorted(self.running.items()):
            where = f"[slot {slot}] " if len(self.running) > 1 or slot != "0" else ""
            lines.append(Spinner("dots", text=Text.assemble(f"{where}trial {number}: ", (stage, "cyan"), "  ",
                                                            (label[:80], "dim"))))
        return Group(*lines)

    def trial_started(self, number: int, label: str, slot: str) -> None:
        self.running[number] = [label, slot, "starting"]
        if not self.console.is_terminal:
            self.console.print(f"trial {number}: {label}" + (f"  [slot {slot}]" if slot != "0" else ""), markup=False)

    def stage(self, number: int, text: str) -> None:
        if number in self.running:
            self.running[number][2] = text
        if not self.console.is_terminal:
            self.console.print(f"  trial {number}: {text}", markup=False)

    def trial_ended(self, number: int, state: TrialState, summary: str, best: Best | None) -> None:
        self.running.pop(number, None)
        self.done += 1
        self.best = best
        colour = {TrialState.COMPLETE: "green", TrialState.PRUNED: "yellow"}.get(state, "red")
        # the summary carries flag values and vLLM's own words: text, never markup
        self.console.print(f"[{colour}]trial {number}[/] {escape(summary)}  [dim]({_hms(self.budget.remaining())} left)[/]",
                           soft_wrap=True)
