"""The command line. The one place where autotune's errors become messages and exit codes.

One module per command family, each a thin layer that turns options into a call of the package that does the
work: `search` (run, worker), `trial`, `estimate`, `results` (status, export, report, dashboard); `options` holds
the option parsing they share, `console` the two consoles everything prints on.
"""

from __future__ import annotations

import sys

import click
from rich.markup import escape

from autotune.cli.compare import compare_command
from autotune.cli.console import err_console
from autotune.cli.estimate import estimate_command
from autotune.cli.interrupt import EXIT_INTERRUPTED, stop_signals_interrupt
from autotune.cli.results import dashboard_command, export_command, report_command, status_command
from autotune.cli.search import run_command, worker_command
from autotune.cli.trial import trial_command
from autotune.errors import AutotuneError


class _Group(click.Group):
    """Turns autotune's errors into one clear line and their exit code (2 for bad input), and Ctrl-C or SIGTERM
    into exit 130 (cli/interrupt.py)."""

    def invoke(self, ctx: click.Context):
        try:
            with stop_signals_interrupt():
                return super().invoke(ctx)
        except AutotuneError as e:
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)  # paths, TOML [tables]
            sys.exit(e.exit_code)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM where the command had nothing of its own to stop
            err_console.print("interrupted", soft_wrap=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="vllm-autotune")
def main() -> None:
    """Find the vLLM serving configuration that gives the most throughput within your latency limits.

    \b
      autotune run studies/tiny-cpu.toml --budget 10m     # the embedded default: no GPU needed
      autotune status                                      # trials so far, best first
      autotune export --format flags                       # the best configuration as `vllm serve` flags
    """
    _quiet_optuna()


def _quiet_optuna() -> None:
    """Optuna's experimental-feature and per-trial log lines drown the progress display; autotune says it all."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    warnings.filterwarnings("ignore", message="Fixed parameter .* is out of range")


for _command in (run_command, worker_command, trial_command, estimate_command, status_command, export_command,
                 report_command, dashboard_command, compare_command):
    main.add_command(_command)
