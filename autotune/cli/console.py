"""The two consoles every command prints on: results to stdout, errors and notes to stderr.

Both show control characters in what they print instead of sending them to the terminal: names and descriptions
come from study files and from shared databases, and an escape sequence among them would retitle, clear or redraw
the user's terminal. Rich's own styling travels apart from the text (as segments' styles and control codes)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 but tab and newline, DEL, C1


def shown(text: str) -> str:
    """Text with its control characters written out (ESC as \\x1b), as a terminal should show them."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class TerminalConsole(Console):
    """A rich Console whose text segments carry no control characters (see the module's note)."""

    def render_str(self, text: str, **kwargs) -> Text:
        return super().render_str(shown(text), **kwargs)  # before the layout, so that widths hold

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and _CONTROL.search(segment.text):
                segment = Segment(shown(segment.text), segment.style)
            yield segment


console = TerminalConsole(highlight=False)
if not console.is_terminal:  # piped or captured: wide enough that tables stay readable in a log
    console = TerminalConsole(highlight=False, width=160)
err_console = TerminalConsole(stderr=True, highlight=False)
