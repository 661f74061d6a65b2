"""Tables that fit where they are printed: a terminal of any width, or a pipe (80 columns).

``show`` prints a rich ``Table`` in three parts: its title as plain lines above it (wrapped
at the width of the screen, not of the table, so a title never breaks mid-phrase in a
narrow table), the table, and its caption below. A table wider than the screen first
leaves out the columns its caller named as optional, in the order given, until the rest
fits with every word whole, and says in one line which columns it left out and how to see
them (``more``); only when even the kept columns do not fit are the longest words of a
cell broken (never cut short with "…"). ``wide``: every column, at the table's natural
width, however wide the screen.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 80
"""The width when the output is not a terminal (rich's default, unless ``COLUMNS`` says)."""


def screen(*, stderr: bool = False) -> Console:
    """A console for tables and messages: no markup or highlighting (names may hold
    ``[brackets]``), 80 columns when not a terminal."""
    return Console(stderr=stderr, markup=False, highlight=False)


def widths(console: Console, table: Table) -> Measurement:
    """The table's narrowest width with whole words, and its natural width."""
    return Measurement.get(console, console.options.update(max_width=1_000_000), table)


def fit(console: Console, table: Table, optional: Sequence[str]) -> list[str]:
    """Leave out columns of ``optional`` (headers, first left out first) until ``table``
    fits the console with every word whole; the headers left out."""
    dropped: list[str] = []
    for header in optional:
        if widths(console, table).minimum <= console.width:
            break
        at = next((i for i, c in enumerate(table.columns) if str(c.header) == header), None)
        if at is not None:
            table.columns.pop(at)
            dropped.append(header)
    return dropped


def show(console: Console, table: Table, *, optional: Sequence[str] = (),
         wide: bool = False, more: str = "") -> None:
    """Print ``table`` to fit ``console`` (module docstring): title, table, caption, and
    which columns were left out (``more``: how to see them, e.g. "--wide shows them")."""
    title, caption = table.title, table.caption
    table.title = table.caption = None
    dropped = [] if wide else fit(console, table, optional)
    if not wide:
        _lay_out(console, table)
    for column in table.columns:
        column.overflow = "fold"  # a word wider than its column is broken, not cut short
    if title:
        console.print(Text(str(title), style="bold"))
    if wide:
        _print_wide(console, table)
    else:
        console.print(table)
    if caption:
        console.print(Text(str(caption), style="dim"))
    if dropped:
        console.print(Text(f"not shown at {console.width} columns: {', '.join(dropped)}"
                           + (f" ({more})" if more else ""), style="dim"))


def _lay_out(console: Console, table: Table) -> None:
    """Set the widths of a table wider than the screen: each column its longest word, the
    room left shared in proportion to what each column would take beyond that (rich's own
    layout shrinks the widest columns first and breaks words, even where every word fits)."""
    measured = widths(console, table)
    if measured.maximum <= console.width:
        return
    options = console.options.update(max_width=1_000_000)
    cells = [[Measurement.get(console, options, cell) for cell in (c.header, *c.cells)]
             for c in table.columns]
    most = [max(m.maximum for m in column) for column in cells]
    least = [hi if c.no_wrap else max(m.minimum for m in column)
             for c, column, hi in zip(table.columns, cells, most, strict=True)]
    frame = measured.maximum - sum(most)  # borders and padding
    room = console.width - frame - sum(least)
    if room < 0:
        return  # even the longest words do not fit: rich folds them
    wanted = [hi - lo for lo, hi in zip(least, most, strict=True)]
    shares = [room * w // max(sum(wanted), 1) for w in wanted]
    for k in sorted(range(len(shares)), key=lambda k: -wanted[k])[:room - sum(shares)]:
        shares[k] += 1  # the rounding's leftovers, to the columns that want most
    for column, lo, share in zip(table.columns, least, shares, strict=True):
        column.width = lo + share


def _print_wide(console: Console, table: Table) -> None:
    """``table`` at its natural width, wider than the screen if need be (a terminal folds
    the lines; a pipe keeps them whole)."""
    screen_width = console.width
    console.width = max(screen_width, widths(console, table).maximum)
    try:
        console.print(table, crop=False)
    finally:
        console.width = screen_width
