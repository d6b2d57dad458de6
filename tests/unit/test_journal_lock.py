"""Two processes appending to one change's journal (``apply`` and ``serve``, or a rollback handed
in while a resume runs): every entry whole, none lost. The appenders serialise on an exclusive
``flock`` of ``journal.jsonl`` (rollout/change/record/journal.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from rollout.change.record.journal import Entry, Journal
from rollout.models import Phase

T = datetime(2026, 11, 30, 21, 48, 2, tzinfo=UTC)

#: An appender in another process that holds the lock through a write the kernel has only half
#: copied when a reader looks (a big line: a concurrent ``pread`` can see part of it).
SLOW_WRITER = """
import fcntl, os, sys, time
from pathlib import Path
path, ready, line = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].encode() + b"\\n"
fd = os.open(path, os.O_RDWR | os.O_APPEND)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, line[: len(line) // 2])
ready.write_text("half")
time.sleep(0.6)
os.write(fd, line[len(line) // 2 :])
os.fsync(fd)
fcntl.flock(fd, fcntl.LOCK_UN)
os.close(fd)
"""


def test_an_append_waits_for_another_appender_s_half_written_line(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, "c")
    journal.append("change", Phase.BEGIN, now=T, data={"first": True})
    theirs = Entry("t", "c", "cordon", Phase.BEGIN, "n1", None, {"pad": "x" * 4096}).to_json()
    ready = tmp_path / "ready"
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, str(journal.file), str(ready), theirs]
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, "writer did not start"
            time.sleep(0.01)
        ours = journal.append("drain", Phase.BEGIN, now=T, node="n2")
    finally:
        assert child.wait(timeout=20) == 0
    lines = journal.file.read_bytes().split(b"\n")
    assert lines[-1] == b""  # ends with a whole line
    assert [json.loads(x)["step"] for x in lines[:-1]] == ["change", "cordon", "drain"]
    got = journal.entries()
    assert got[1].data["pad"] == "x" * 4096 and got[2] == ours


APPENDER = """
import sys
from datetime import UTC, datetime
from pathlib import Path
from rollout.change.record.journal import Journal
from rollout.models import Phase
root, who, n, go = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
journal = Journal.open(root, "c")
while not go.exists():
    pass
for i in range(n):
    journal.append("drain", Phase.BEGIN, now=datetime.now(UTC), node=f"{who}-{i}",
                   data={"pad": who * (1000 + 37 * i)})
"""


def test_two_processes_appending_at_once_lose_and_tear_no_entry(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, "c")
    journal.file.write_bytes(b'{"change":"c","phase":"begin","st')  # a killed writer's torn tail
    go, n = tmp_path / "go", 150
    procs = [
        subprocess.Popen([sys.executable, "-c", APPENDER, str(tmp_path), who, str(n), str(go)])
        for who in ("a", "b")
    ]
    time.sleep(0.5)  # both past their imports, spinning on the start signal
    go.touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    raw = journal.file.read_bytes()
    assert raw.endswith(b"\n")
    entries = [Entry.from_json(json.loads(x)) for x in raw.split(b"\n")[:-1]]  # every line whole
    nodes = [e.node for e in entries]
    assert sorted(nodes) == sorted(f"{w}-{i}" for w in "ab" for i in range(n))  # none lost, once
    for e in entries:
        who, i = str(e.node).split("-")
        assert e.data["pad"] == who * (1000 + 37 * int(i))
    for who in "ab":  # each process's entries in the order it wrote them
        assert [x for x in nodes if str(x).startswith(who)] == [f"{who}-{i}" for i in range(n)]
