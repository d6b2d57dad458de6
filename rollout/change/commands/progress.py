"""Live progress of a change: a per-node table on a terminal, plain lines in CI logs.

Why: a batch of kubelet restarts takes minutes per node (drain, restart, verify), and the person
watching needs to see which node is in which step without reading a scrolling log; a CI log, on
the other hand, is read afterwards and must not be full of cursor movements. Both views are fed
by the same two streams the orchestrator already produces: every journal entry (node, step,
phase, path) and every event message. The formatting is pure (:class:`Board`, :func:`table`,
:func:`plain_line`), so it is tested without a terminal; :class:`Progress` only decides where
the text goes and, on a terminal, redraws the table in place.

Everything goes to standard error: standard output stays the command's result (``-o json``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol, TextIO

from rollout.change.record.journal import Entry, Handed, Journal
from rollout.models import Phase, StepPath


@dataclass(frozen=True)
class Row:
    """One node's line in the table.

    Attributes:
        node: the Node name.
        step: the last journaled step (``cordon``, ``drain``, ``apply``, ``restore`` ...).
        phase: ``begin`` / ``done`` / ``failed``.
        path: ``forward`` or ``restore``.
        since: when the step was journaled (ISO time).
        note: the last event message about the node (``drained (3 pod(s) evicted)``).
    """

    node: str
    step: str = "pending"
    phase: str = ""
    path: str = ""
    since: str = ""
    note: str = ""

    @property
    def state(self) -> str:
        """A short state for the table: ``drain…``, ``apply ok``, ``restore FAILED``."""
        if not self.phase:
            return self.step
        if self.phase == Phase.BEGIN:
            return f"{self.step}…"
        if self.phase == Phase.FAILED:
            return f"{self.step} FAILED"
        return f"{self.step} ok"


@dataclass(frozen=True)
class Board:
    """What the table shows: every node's row, in first-seen order, and the last message."""

    rows: tuple[Row, ...] = ()
    last: str = ""

    def with_nodes(self, nodes: tuple[str, ...]) -> Board:
        """The board with rows for ``nodes`` that are not on it yet (pending)."""
        have = {r.node for r in self.rows}
        return replace(self, rows=(*self.rows, *(Row(n) for n in nodes if n not in have)))

    def apply(self, entry: Entry) -> Board:
        """The board after one journal entry (entries without a node change nothing)."""
        if entry.node is None:
            return self
        rows = list(self.with_nodes((entry.node,)).rows)
        i = next(i for i, r in enumerate(rows) if r.node == entry.node)
        rows[i] = replace(
            rows[i],
            step=str(entry.step),
            phase=str(entry.phase),
            path=str(entry.path or ""),
            since=entry.ts,
        )
        return replace(self, rows=tuple(rows))

    def event(self, message: str) -> Board:
        """The board after an event message; ``"<node>: text"`` becomes that node's note."""
        node, sep, text = message.partition(": ")
        rows = self.rows
        if sep and any(r.node == node for r in rows):
            rows = tuple(replace(r, note=text) if r.node == node else r for r in rows)
        return replace(self, rows=rows, last=message)


def _clock(ts: str) -> str:
    try:
        return datetime.fromisoformat(ts).strftime("%H:%M:%S")
    except ValueError:
        return ts


def table(board: Board, width: int = 100) -> list[str]:
    """The table's lines (header first), each cut to ``width`` characters."""
    name_w = max([4, *(len(r.node) for r in board.rows)])
    lines = [f"{'NODE':<{name_w}}  {'PATH':<8} {'STEP':<18} {'SINCE':<8}  NOTE"]
    for r in board.rows:
        lines.append(
            f"{r.node:<{name_w}}  {r.path or '-':<8} {r.state:<18} {_clock(r.since) or '-':<8}"
            f"  {r.note}"
        )
    if board.last:
        lines.append(f"> {board.last}")
    return [ln[:width].rstrip() for ln in lines]


def plain_line(entry: Entry) -> str | None:
    """One log line per node step (``12:00:01 gpu-07 forward drain begin``); None for entries
    that are not about a node (the command's own messages cover those)."""
    if entry.node is None:
        return None
    path = f" {entry.path}" if entry.path else ""
    return f"{_clock(entry.ts)} {entry.node}{path} {entry.step} {entry.phase}"


class Stream(Protocol):
    """Where progress goes (standard error)."""

    def write(self, text: str, /) -> Any: ...

    def flush(self) -> Any: ...


@dataclass
class Progress:
    """Feeds a :class:`Board` and writes it: a table redrawn in place (``table``) or plain lines
    (``plain``); ``off`` writes event messages only, as before.

    Args:
        stream: where to write.
        mode: ``table``, ``plain`` or ``off`` (resolve ``auto`` with :func:`resolve_mode`).
        width: the terminal's width (table mode).
    """

    stream: Stream
    mode: str = "plain"
    width: int = 100
    board: Board = Board()
    _drawn: int = 0

    def nodes(self, names: tuple[str, ...]) -> None:
        """Show these nodes as pending before anything happens to them."""
        self.board = self.board.with_nodes(names)
        self._draw()

    def entry(self, entry: Entry) -> None:
        """A journal entry was written."""
        self.board = self.board.apply(entry)
        if self.mode == "plain":
            line = plain_line(entry)
            if line is not None:
                self._write(line + "\n")
        self._draw()

    def event(self, message: str) -> None:
        """An event message (``gpu-07: drained (3 pod(s) evicted)``, ``batch 2/3: ...``)."""
        self.board = self.board.event(message)
        if self.mode != "table":
            self._write(message + "\n")
        elif self.board.last == message and not _about_a_row(self.board, message):
            # not about one node (a batch, the gate, a warning): keep it above the table
            self.board = replace(self.board, last="")
            self._write(self._erase() + message + "\n")
            self._drawn = 0
            self._draw()
        else:
            self._draw()

    def close(self) -> None:
        """Leave the final table on screen."""
        self._drawn = 0

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _draw(self) -> None:
        if self.mode != "table":
            return
        lines = table(self.board, self.width)
        self._write(self._erase() + "".join(ln + "\n" for ln in lines))
        self._drawn = len(lines)

    def _erase(self) -> str:
        """Move up over the last drawing and clear to the end of the screen."""
        return f"\x1b[{self._drawn}F\x1b[J" if self._drawn else ""


def _about_a_row(board: Board, message: str) -> bool:
    node, sep, _ = message.partition(": ")
    return bool(sep) and any(r.node == node for r in board.rows)


def resolve_mode(mode: str, isatty: bool, env: Mapping[str, str]) -> str:
    """``auto`` is a table on a terminal (unless ``TERM=dumb`` or ``CI`` is set), else plain."""
    if mode != "auto":
        return mode
    if isatty and env.get("TERM", "") != "dumb" and not env.get("CI"):
        return "table"
    return "plain"


class ObservedJournal(Journal):
    """A journal that also tells ``observer`` about every entry it has written (and fsynced)."""

    def __init__(self, journal: Journal, observer: Callable[[Entry], None]) -> None:
        super().__init__(journal.dir, journal.change_id)
        self.mirror = journal.mirror
        self._observer = observer

    def append(
        self,
        step: str,
        phase: Phase,
        *,
        now: datetime,
        node: str | None = None,
        path: StepPath | None = None,
        data: Mapping[str, Any] | None = None,
        handed: Handed | None = None,
        mirror_later: bool = False,
    ) -> Entry:
        entry = super().append(
            step,
            phase,
            now=now,
            node=node,
            path=path,
            data=data,
            handed=handed,
            mirror_later=mirror_later,
        )
        self._observer(entry)
        return entry


def for_stream(stream: TextIO, mode: str, env: Mapping[str, str], width: int) -> Progress:
    """A :class:`Progress` on ``stream`` with ``mode`` resolved for it."""
    isatty = bool(getattr(stream, "isatty", lambda: False)())
    return Progress(stream, resolve_mode(mode, isatty, env), width)
