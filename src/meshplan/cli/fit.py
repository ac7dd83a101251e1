"""Tables that fit the terminal without cutting a cell, and help screens that keep every flag whole.

Rich narrows a table wider than the console by shrinking its widest columns and cuts a word wider
than its column with an ellipsis: at 80 columns a search's step time printed as ``13…`` and a run
id lost its tail. :class:`FitTable` is a rich table that never does that. At render time, at the
console's width, it is printed whole if it can be, in this order of preference:

1. every column at its natural width;
2. every data cell on one line, headers wrapped at their words;
3. every word whole: wrapping columns wrap at word boundaries, ``no_wrap`` ones (a number, a
   layout, a name) keep each line whole;

each first with the full headers, then with the columns' short ones where they have one
(``add_column(..., short="grads")``). Below the natural widths a table without vertical rules
closes up its padding (one space less between columns), and the room beyond the narrowest widths
goes first to the columns that need least to be whole. Else it is printed in parts: the first
``keys`` columns (the row's name: a rank, a run id) lead each part and the other columns follow
in order, as many as the width holds (``breaks``: where a part may start, to keep related columns
together). A single word wider than the whole console folds onto the next line rather than
being cut.

:func:`keep_flags_whole` does the same for typer's help screens, whose option columns rich would
otherwise cut (``--attention-kern…`` at 80 columns).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Iterable, Optional

from rich.columns import Columns
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

_WIDE = 1 << 20  # a width no table reaches: measuring at it gives natural widths


class FitTable(Table):
    """A :class:`rich.table.Table` printed whole or in parts so that no cell is cut at the
    console's width (the module's docstring says how). ``keys``: how many leading columns name a
    row and lead every part; ``breaks``: column indices where a part may start (default: any)."""

    def __init__(self, *args, keys: int = 1, breaks: Iterable[int] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.keys = keys
        self.breaks = tuple(breaks)
        self.short: dict[int, str] = {}
        self._fitted = False

    def add_column(self, *args, short: Optional[str] = None, **kwargs) -> None:
        """As :meth:`rich.table.Table.add_column`, with a word too wide for any width folded, not
        cut; ``short``: the header to use when the table is too wide for the full ones."""
        if short is not None:
            self.short[len(self.columns)] = short
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self._fitted or not self.columns:
            yield from super().__rich_console__(console, options)
            return
        yield from self.parts(console, options.max_width)

    def parts(self, console: Console, width: int) -> list[Table]:
        """The tables to print at ``width`` columns: this one with its columns sized, or its parts."""
        for column in self.columns:  # a row's cells added before a column's overflow was set
            if column.overflow == "ellipsis":
                column.overflow = "fold"
        tables = [self] + ([self._shortened()] if self.short else [])
        sized = [(table, [_content_width(console, column, self.show_header) for column in table.columns]) for table in tables]
        every = list(range(len(self.columns)))
        for level in (2, 1, 0):  # natural widths, every data cell on one line, every word whole
            for table, sizes in sized:
                part = table._sized(console, sizes, every, width, level)
                if part is not None:
                    return [part]
        table, sizes = sized[-1]
        return table._split(console, sizes, width)

    def _shortened(self) -> "FitTable":
        """This table with the short headers."""
        table = copy.copy(self)
        table.columns = [replace(c, header=self.short.get(i, c.header)) for i, c in enumerate(self.columns)]
        return table

    def _split(self, console: Console, sizes: list[tuple[int, int, int]], width: int) -> list[Table]:
        """The parts of this table at ``width``: the key columns and as many others as fit, in order."""
        keys = list(range(min(self.keys, len(self.columns) - 1)))
        starts = set(self.breaks) or set(range(len(self.columns)))
        units, unit = [], []
        for i in range(len(keys), len(self.columns)):
            if i in starts and unit:
                units.append(unit)
                unit = []
            unit.append(i)
        units.append(unit)
        groups = _pack(units, lambda cols: self._sized(console, sizes, keys + cols, width) is not None)
        out = []
        for n, cols in enumerate(groups):
            part = self._sized(console, sizes, keys + cols, width) or self._forced(console, sizes, keys + cols, width)
            part.title = self.title if n == 0 or self.title is None else f"{self.title} (continued)"
            part.caption = self.caption if n == len(groups) - 1 else None
            out.append(part)
        return out

    def _part(self, cols: list[int], close: bool) -> "FitTable":
        """The table of columns ``cols``; ``close``: without the padding left of each cell (rich's
        own ``collapse_padding`` measures the first column one narrower than it draws it)."""
        part = copy.copy(self)
        part.columns = [replace(self.columns[i], _index=j) for j, i in enumerate(cols)]
        if close:
            top, right, bottom, _ = self.padding
            part.padding = (top, right, bottom, 0)
        part._fitted = True
        return part

    def _sized(self, console: Console, sizes: list[tuple[int, int, int]], cols: list[int], width: int,
               level: int = 0) -> Optional["FitTable"]:
        """The table of columns ``cols`` within ``width``, or None if it cannot give each column its
        width at ``level``: 2 natural, 1 every data cell on one line (headers wrapped), 0 every
        word whole. Below the natural widths, a table without vertical rules closes up its padding
        and the room is shared by :func:`_spread`."""
        lo, mid, hi = ([sizes[i][k] for i in cols] for k in range(3))
        part = self._part(cols, False)
        room = width - _overhead(console, part)
        if sum(hi) <= room:
            return part
        if level == 2:
            return None
        if _blank_rules(self):
            part = self._part(cols, True)
            room = width - _overhead(console, part)
        if sum((lo, mid)[level]) > room:
            return None
        for column, w in zip(part.columns, _spread(lo, mid, hi, room)):
            column.width = w
        return part

    def _forced(self, console: Console, sizes: list[tuple[int, int, int]], cols: list[int], width: int) -> "FitTable":
        """A part wider than ``width`` even alone: the keys whole, the last column folded into the rest."""
        part = self._part(cols, _blank_rules(self))
        room = width - _overhead(console, part)
        for column, i in zip(part.columns[:-1], cols):
            column.width = sizes[i][0]
            room -= sizes[i][0]
        part.columns[-1].width = max(1, room)
        return part


def _content_width(console: Console, column, show_header: bool) -> tuple[int, int, int]:
    """(narrowest, data, natural) width of a column's cells: the narrowest keeps every word whole
    (every line of a ``no_wrap`` column), the data width every data cell on one line, the
    natural width the header too; a set ``width`` is all three."""
    if column.width is not None:
        return column.width, column.width, column.width
    options = console.options.update_width(_WIDE)
    header = [Measurement.get(console, options, column.header)] if show_header else []
    data = [Measurement.get(console, options, cell) for cell in column.cells] or [Measurement(0, 0)]
    sizes = header + data
    natural = max(m.maximum for m in sizes)
    narrow = natural if column.no_wrap else max(m.minimum for m in sizes)
    if column.min_width is not None:
        narrow, natural = max(narrow, column.min_width), max(natural, column.min_width)
    return narrow, min(natural, max(narrow, max(m.maximum for m in data))), natural


def _overhead(console: Console, table: Table) -> int:
    """Columns of ``table`` that are not cell content: padding, rules and edges."""
    probe = copy.copy(table)
    probe.columns = [replace(c, width=1, _cells=[]) for c in table.columns]
    probe.rows = []
    probe.title = probe.caption = None
    return Measurement.get(console, console.options.update_width(_WIDE), probe).minimum - len(table.columns)


def _blank_rules(table: Table) -> bool:
    """True when the table draws no vertical rule between its columns (closing up padding keeps it readable)."""
    return table.box is None or (table.box.head_vertical.strip() == "" and table.box.mid_vertical.strip() == "")


def _spread(lo: list[int], mid: list[int], hi: list[int], room: int) -> list[int]:
    """Widths from ``lo`` toward ``mid`` (data cells on one line), then toward ``hi`` (headers
    too), within ``room`` (sum(lo) <= room < sum(hi)). At each stage the columns that need least
    come first, so that as few columns as can be wrap: a wrapped header costs one line, a
    wrapped data column one per row."""
    widths = list(lo)
    spare = room - sum(lo)
    for target in (mid, hi):
        for i in sorted(range(len(widths)), key=lambda i: target[i] - widths[i]):
            give = max(0, min(target[i] - widths[i], spare))
            widths[i] += give
            spare -= give
    return widths


def _pack(units: list[list[int]], fits) -> list[list[int]]:
    """Consecutive ``units`` of columns packed into as few parts as ``fits(columns)`` allows, in
    order; a unit too wide alone is split into its columns, a column too wide alone is a part."""
    parts: list[list[int]] = []
    current: list[int] = []
    queue = list(units)
    while queue:
        unit = queue.pop(0)
        if fits(current + unit):
            current = current + unit
        elif len(unit) > 1 and not fits(unit):
            queue[:0] = [[i] for i in unit]
        else:
            if current:
                parts.append(current)
            current = unit
    if current or not parts:
        parts.append(current)
    return parts


# ---- typer's help --------------------------------------------------------------------------------


class _HelpTable(Table):
    """typer's help panel table: the flag columns (all but the type and the description) never
    narrower than their flags, a flag's negative form (``--no-...``) under it rather than in a
    column of its own (the description keeps that width), a type's choices
    (``<none|selective|full>``) wrapped after a bar, and a word of the type or description wider
    than its column folded rather than cut."""

    def add_row(self, *renderables, **kwargs) -> None:
        cells = [_folding(r) for r in renderables]
        if len(cells) >= 6 and all(isinstance(c, Text) for c in cells[-6:-2]):
            # an option's row: [required,] long flags, short flags, negative long, negative short, type, help
            long, short, no_long, no_short = cells[-6:-2]
            cells[-6:-2] = [_under(long, no_long), _under(short, no_short)]
        if len(cells) >= 2 and isinstance(cells[-2], Text) and "|" in cells[-2].plain:
            cells[-2] = _Choices(cells[-2])
        super().add_row(*cells, **kwargs)
        for column in self.columns[:-2]:
            column.no_wrap = True
        for column in self.columns[-2:]:
            column.overflow = "fold"


class _Choices:
    """An option's choices, ``<a|b|c>``, broken into lines after a bar where the column is narrow,
    so that no choice is split (unless one alone is wider than the column)."""

    def __init__(self, text: Text) -> None:
        ends = [i + 1 for i, ch in enumerate(text.plain) if ch == "|"]
        self.pieces = list(text.divide(ends))

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        longest = max(p.cell_len for p in self.pieces)
        whole = sum(p.cell_len for p in self.pieces)
        return Measurement(min(longest, options.max_width), min(whole, options.max_width))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = Text(overflow="fold")
        for piece in self.pieces:
            if line.cell_len and line.cell_len + piece.cell_len > options.max_width:
                yield line
                line = Text(overflow="fold")
            line.append_text(piece)
        yield line


def _under(first: Text, second: Text) -> Text:
    """``first`` with ``second`` on the line below it (``first`` alone when ``second`` is empty)."""
    return Text.assemble(first, "\n", second) if second.plain else first


def _folding(renderable):
    """``renderable`` with its text (or a help column's texts) folding a word too wide for its line."""
    if isinstance(renderable, Text) and renderable.overflow in (None, "ellipsis"):
        renderable.overflow = "fold"
    elif isinstance(renderable, Columns):
        for item in renderable.renderables:
            _folding(item)
    return renderable


def keep_flags_whole() -> None:
    """Make typer's help screens keep every flag whole at any width: its option panels are built
    from ``typer.rich_utils.Table``, replaced here by :class:`_HelpTable`."""
    import typer.rich_utils

    typer.rich_utils.Table = _HelpTable  # type: ignore[attr-defined]
