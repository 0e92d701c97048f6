"""Tables that fit the terminal: columns are chosen by priority, never cut.

Each column has a priority (0 = always shown). The table keeps the columns, in their
display order, that fit the width, adding them by priority; a cell is never truncated
and a number never loses digits. Width None (`--wide`) keeps every column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class Col:
    name: str
    priority: int = 0              # 0: always; then 1, 2, ... as width allows
    justify: str = "right"


def _table(title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[Any]], styles: Sequence[str | None],
           caption: str | None) -> Table:
    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, padding=(0, 1, 0, 0), show_edge=False)
    for c in cols:
        t.add_column(c.name, justify=c.justify, no_wrap=True)  # type: ignore[arg-type]
    for r, st in zip(rows, styles, strict=True):
        t.add_row(*r, style=st)
    return t


def natural_width(table: Table) -> int:
    """Columns the table needs so that no cell wraps (titles and captions may wrap)."""
    title, caption = table.title, table.caption
    table.title = table.caption = None
    try:
        console = Console(width=100_000, emoji=False)
        return Measurement.get(console, console.options, table).maximum
    finally:
        table.title, table.caption = title, caption


def fit_table(cols: Sequence[Col], rows: Sequence[Sequence[Any]], width: int | None, *, title: str | None = None,
              styles: Sequence[str | None] | None = None, caption: str | None = None) -> Table:
    """A rich Table with the columns that fit `width` (all of them when width is None)."""
    styles = list(styles) if styles is not None else [None] * len(rows)
    keep = [i for i, c in enumerate(cols) if c.priority == 0 or width is None]
    # a column's width is its widest cell; SIMPLE_HEAD without edges puts 2 columns between neighbours
    w = [max(cell_len(c.name), *(cell_len(str(r[i])) for r in rows)) for i, c in enumerate(cols)]
    if width is not None:
        for i in sorted((i for i, c in enumerate(cols) if c.priority > 0), key=lambda i: (cols[i].priority, i)):
            trial = sorted([*keep, i])
            if sum(w[j] for j in trial) + 2 * (len(trial) - 1) <= width:
                keep = trial
    t = _table(title, [cols[j] for j in keep], [[r[j] for j in keep] for r in rows], styles, caption)
    # its natural width (= natural_width(t), checked in tests/test_small_fixes_28.py): print_table need not measure
    t.nanoplan_width = sum(w[j] for j in keep) + 2 * (len(keep) - 1)  # type: ignore[attr-defined]
    return t


def cell_len(markup: str) -> int:
    """Terminal cells a table cell takes (rich markup removed, wide characters counted)."""
    return Text.from_markup(markup, emoji=False).cell_len     # cells hold no ':emoji:' (its table costs 3 ms)


def hidden(cols: Sequence[Col], table: Table) -> list[str]:
    """Names of the columns fit_table left out."""
    shown = {str(c.header) for c in table.columns}
    return [c.name for c in cols if c.name not in shown]


def hidden_note(cols: Sequence[Col], table: Table, how: str = "--wide shows all") -> str:
    """'Hidden at this width: a, b (--wide shows all).' for the columns fit_table left out; '' when none."""
    gone = hidden(cols, table)
    return f"Hidden at this width: {', '.join(gone)} ({how})." if gone else ""


def print_table(console: Console, table: Table) -> None:
    """Print without cutting a cell: widen the console for this table when the terminal is narrower."""
    need = getattr(table, "nanoplan_width", None) or natural_width(table)
    if need <= console.width:
        console.print(table)
        return
    old = console.width
    console.width = need
    try:
        console.print(table)
    finally:
        console.width = old
