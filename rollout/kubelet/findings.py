"""Findings: what lint reports, and what the lab kubelet logs when it refuses to start."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    """One problem in a kubelet configuration.

    ``message`` quotes the kubelet's own wording where the kubelet has one. ``file`` and ``line``
    say where the offending value was set (the config file, a drop-in, or a flags file).
    """

    severity: Severity
    field: str
    message: str
    file: str | None = None
    line: int | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = str(self.severity)
        return d

    def describe(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        return f"{where}{self.severity}: {self.field}: {self.message}"
