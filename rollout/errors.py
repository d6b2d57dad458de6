"""One exception tree for the whole tool, so the CLI can map failures to exit codes in one place.

::

    RolloutError              exit 1  anything the tool knows how to explain
      InputError              exit 2  bad input: file, field, line named; nothing changed
        ParseError                    malformed YAML / JSON
        UnknownDistributionError
        ConflictError                 our setting would be overridden or refused by the kubelet
      PreflightError          exit 3  the cluster or nodes refuse the change before it starts
      LockHeldError           exit 4  another change holds the cluster Lease
        LeaseLostError                the owner lost the Lease mid-change (and stopped)
      NodeOperationError      exit 5  a step on a node failed (the node was restored)
        EvictionBlockedError          a PodDisruptionBudget kept refusing an eviction
      LabError                exit 6  the local lab could not be built, started or stopped
      ExternalError           exit 7  an API server, SSH or Ansible call failed unexpectedly
        ApiError                      the API server answered with an error status (``status``)

Errors keep their cause (``raise ... from e``); API bodies are truncated before they reach a
message.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def suggest(word: str, choices: Iterable[Any]) -> str:
    """`` (did you mean "x"?)`` when a close match exists, else the empty string."""
    match = difflib.get_close_matches(word, [str(c) for c in choices], n=1)
    return f' (did you mean "{match[0]}"?)' if match else ""


class RolloutError(Exception):
    """Base of every error the tool raises on purpose."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Location:
    """Where in an input a problem is: file, field (dotted path) and 1-based line, each optional."""

    file: str | None = None
    field: str | None = None
    line: int | None = None

    def describe(self) -> str:
        parts = []
        if self.file:
            parts.append(self.file + (f":{self.line}" if self.line else ""))
        if self.field:
            parts.append(f"field {self.field!r}")
        return ", ".join(parts)


class InputError(RolloutError):
    """Bad input. The message names the file, field and line; nothing has been changed."""

    exit_code = 2

    def __init__(self, message: str, location: Location | None = None) -> None:
        self.location = location or Location()
        where = self.location.describe()
        super().__init__(f"{where}: {message}" if where else message)


def read_input(path: Path | str, name: str | None = None) -> str:
    """The text of an input file the operator named (``name``: how messages call it; the path
    by default).

    Raises:
        InputError: the file is missing ("no such file") or unreadable ("cannot read: ...").
    """
    shown = name or str(path)
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise InputError("no such file", Location(file=shown)) from e
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read: {e}", Location(file=shown)) from e


class ParseError(InputError):
    """A file is not valid YAML or JSON."""


class UnknownDistributionError(InputError):
    """The distribution name is not one the tool supports."""


class ConflictError(InputError):
    """A setting would be silently overridden on the node, or the kubelet would refuse it."""


class PreflightError(RolloutError):
    """The change was refused before anything was touched."""

    exit_code = 3


class NodeFilesChangedError(PreflightError):
    """A node's kubelet files changed after preflight read them (the compare-and-swap right
    before the write failed): nothing was written on that node, our cordon was undone, and the
    change stopped. A preflight-class refusal: run the change again to plan from the new files."""


class LockHeldError(RolloutError):
    """Another change holds the cluster lock."""

    exit_code = 4


class LeaseLostError(LockHeldError):
    """The owner lost its Lease mid-change: it started nothing new, restored the nodes in flight."""


class NodeOperationError(RolloutError):
    """A step on a node failed."""

    exit_code = 5


class EvictionBlockedError(NodeOperationError):
    """A PodDisruptionBudget refused evictions until the drain timeout."""


class LabError(RolloutError):
    """The local lab could not be built, started or stopped."""

    exit_code = 6


class ExternalError(RolloutError):
    """An API server, SSH or Ansible call failed in a way the tool did not expect."""

    exit_code = 7


class ApiError(ExternalError):
    """The API server answered a request with an error status. ``status`` is the HTTP code
    (404, 409, 422 ..., 0 when no answer came), ``reason`` its phrase; the message quotes the
    API server's own ``message``, truncated. ``rollout.kube`` raises it for every error answer
    (nothing outside that package sees the client's exception type) and decides on 404, 409
    and 429 itself where they are expected outcomes."""

    def __init__(self, message: str, status: int, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def truncate(body: str, limit: int = 300) -> str:
    """Shorten an API response body for a message."""
    body = " ".join(body.split())
    return body if len(body) <= limit else body[: limit - 3] + "..."
