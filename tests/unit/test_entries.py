"""The typed record (``rollout.change.record.entries``): journals written before it read the same,
its payloads are the ones the writers wrote before, unknown keys of the same schema version are
ignored (and a change's ``begin`` carries them on), a newer version is refused, and nothing
outside the module reads a payload by string key."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from rollout.change.commands.promote_change import evidence_refusal, last_gate, promote_refusal
from rollout.change.engine.orchestrator import rollback
from rollout.change.engine.resumption import unfinished_gate, unfinished_rollback
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.record.entries import (
    SCHEMA_VERSION,
    BenchVerdict,
    ChangeBegin,
    ChangeEnd,
    EvidenceRecord,
    GateRecord,
    Promotion,
    RequestRecord,
    TriggerRecord,
)
from rollout.change.record.journal import CHANGE_STEP, Entry, Journal, Kind, read_entries
from rollout.change.record.replay import replay
from rollout.errors import InputError
from rollout.evidence.report import build_report
from rollout.models import Phase
from tests.unit.fakes_change import FakeClock, FakeCluster, FakeRunner, make_node

FIXTURES = Path(__file__).parent / "data" / "journals"
NAMES = ["promoted", "requested", "interrupted"]
ROLLOUT = Path(__file__).parents[2] / "rollout"


def _plain(value: Any) -> Any:
    """``value`` as ``write_fixtures.py`` wrote it into ``expected.json`` (same rules)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "value"):
        return value.value
    return value


def _fixture(name: str) -> tuple[list[Entry], dict[str, Any]]:
    entries = read_entries(FIXTURES / name / "journal.jsonl")
    return entries, json.loads((FIXTURES / name / "expected.json").read_text())


def _same(doc: Any) -> Any:
    """``doc`` as ``expected.json`` holds it (JSON: tuples are lists)."""
    return json.loads(json.dumps(doc, sort_keys=True, default=str))


@pytest.mark.parametrize("name", NAMES)
def test_journals_written_before_read_the_same(name: str, tmp_path: Path) -> None:
    entries, want = _fixture(name)
    status = replay(entries, entries[0].change)
    assert _same(status.to_dict()) == want["status"]
    report, want_report = _same(build_report(entries).as_dict()), dict(want["report"])
    # the report's evidence checks are the checks catalogue's over the collections (none here),
    # not the journal's: the catalogue grew after the fixtures (gpus-served-once)
    checks, want_checks = report.pop("evidence"), want_report.pop("evidence")
    assert report == want_report
    assert (checks["source"], checks["status"]) == (want_checks["source"], want_checks["status"])
    assert _same(_plain(unfinished_rollback(entries))) == want["unfinishedRollback"]
    assert _same(_plain(unfinished_gate(entries, has_gate=True))) == want["unfinishedGate"]
    canary = [n for b in status.info.batches[:1] for n in b]
    assert evidence_refusal(entries, canary) == want["evidenceRefusal"]
    journal = Journal.create(tmp_path, entries[0].change)
    journal.file.write_bytes((FIXTURES / name / "journal.jsonl").read_bytes())
    assert promote_refusal(status, last_gate(journal)) == want["promoteRefusal"]


@pytest.mark.parametrize("name", NAMES)
def test_entries_without_a_version_read_as_v1(name: str) -> None:
    """Lines without ``v`` (the journal's first writers) are schema v1 and replay alike."""
    entries, want = _fixture(name)
    lines = (FIXTURES / name / "journal.jsonl").read_text().splitlines()
    bare = []
    for line in lines:
        obj = json.loads(line)
        assert obj.pop("v") == SCHEMA_VERSION
        bare.append(Entry.from_json(obj))
    assert _same(replay(bare, entries[0].change).to_dict()) == want["status"]


@pytest.mark.parametrize("name", NAMES)
def test_each_payload_written_before_reads_and_writes_back_byte_for_byte(name: str) -> None:
    """The types spell the keys the writers spelt: a payload read and written again is the same
    JSON (so a promotion or rollback that journals the ``begin`` again keeps it whole)."""
    entries, _ = _fixture(name)
    seen = set()
    for e in entries:
        d = dict(e.data)
        if e.step == CHANGE_STEP and e.phase is Phase.BEGIN:
            assert ChangeBegin.read(d).data() == d
            seen.add("begin")
        elif e.step == CHANGE_STEP:
            assert ChangeEnd.read(d).data() == d
            seen.add("end")
        elif e.step == Kind.GATE:
            assert GateRecord.read(d).data() == d
            seen.add("gate")
        elif e.step == Kind.REQUEST:
            assert RequestRecord.read(d).data() == d
            seen.add("request")
    assert {"begin", "end"} <= seen or name == "interrupted"


def test_the_fixtures_carry_every_change_level_kind_but_bench_and_recreate() -> None:
    """What the fixtures cover: every entry kind of the catalogue except a ``bench`` run and a
    ``recreate`` (their writers run a node's benchmark or evict pods: the lab tests cover them,
    ``tests/lab/test_bench_lab.py`` and ``tests/lab/test_recreate_lab.py``), and ``claim-freeze``,
    newer than the fixtures: the allocation-path change's own step
    (``rollout/change/kinds/claim_freeze.py``, ``tests/unit/test_claim_freeze.py``)."""
    kinds = {e.step for n in NAMES for e in _fixture(n)[0] if e.node is None}
    assert set(Kind) - kinds == {Kind.BENCH, Kind.RECREATE, Kind.CLAIM_FREEZE}


def test_the_typed_status_shows_what_the_payloads_say() -> None:
    entries, _ = _fixture("promoted")
    status = replay(entries)
    info = status.info
    assert info.stage is not None and (info.stage.name, info.stage.index) == ("static", 0)
    assert info.promotion == Promotion(
        by="bob@desk pid 7",
        at="2026-01-01T00:10:00+00:00",
        batches=(("n3",), ("n4",)),
        forced_refusals=(),
    )
    assert info.rollback is not None and info.rollback.nodes == ("n3", "n4")
    assert info.rollback.force is True
    assert info.batches == (("n1", "n2"), ("n3",), ("n4",))
    assert status.bench == BenchVerdict.read(
        next(e.data for e in entries if e.step == Kind.BENCH_VERDICT)
    )
    assert status.bench is not None and status.bench.tightening.outcome == "Failed"
    assert status.evidence["recreated"].error == "ssh: n2 unreachable"
    after = status.evidence["after"]
    assert after.nodes == ("n1", "n2") and after.overall == "not-collected"
    assert "fail" not in {c.status for c in after.checks} and "pass" in {
        c.status for c in after.checks
    }
    (alert,) = status.triggers
    assert (alert.alert, alert.nodes, alert.outcome) == (
        "KubeletTopologyAffinityRejections",
        ("n4",),
        "rolled-back",
    )


def test_unknown_keys_of_the_same_version_are_ignored_and_a_begin_carries_them_on(
    tmp_path: Path,
) -> None:
    """A v1 payload with a key this version does not know (a newer writer that added a field
    without changing what the known ones mean) reads as if it were not there; the change's
    ``begin``, journaled again by a rollback, keeps it."""
    cluster = FakeCluster({n: make_node(n) for n in ("n1", "n2")})
    journal = Journal.create(tmp_path, "20260101T000000Z-newer")
    now = FakeClock().now()
    begin = {"nodes": ["n1", "n2"], "batches": [["n1"], ["n2"]], "canary": ["n1"]}
    journal.append(CHANGE_STEP, Phase.BEGIN, now=now, data={**begin, "ticket": "OPS-7"})
    journal.append(Kind.GATE, Phase.DONE, now=now, data={"status": "Successful", "why": "x"})
    journal.append(CHANGE_STEP, Phase.DONE, now=now, data={"outcome": "held", "later": 1})
    status = replay(journal.entries())
    assert status.outcome == "held" and status.info.batches == (("n1",), ("n2",))
    assert status.info.extra == {"ticket": "OPS-7"}
    assert GateRecord.read(journal.entries()[1].data) == GateRecord((), "Successful", "")
    from rollout.change.engine.context import Context

    ctx = Context(
        cluster=cluster,
        runner=FakeRunner(cluster),
        clock=FakeClock(),
        journal=journal,
        drain=DrainPolicy(timeout_s=5, backoff_initial_s=0.5, backoff_cap_s=2),
        verify_timeout_s=3,
    )
    rollback(ctx)
    again = [e for e in journal.entries() if e.step == CHANGE_STEP and e.phase is Phase.BEGIN]
    assert again[-1].data["ticket"] == "OPS-7" and again[-1].data["rollback"]["force"] is False


def test_a_payload_of_a_newer_schema_is_refused_by_name(tmp_path: Path) -> None:
    newer = {"v": SCHEMA_VERSION + 1, "ts": "t", "change": "c", "step": "change", "phase": "begin"}
    (tmp_path / "journal.jsonl").write_text(json.dumps(newer) + "\n")
    with pytest.raises(InputError, match=f"schema v{SCHEMA_VERSION + 1}, written by a newer"):
        read_entries(tmp_path / "journal.jsonl")


def test_typed_reads_of_missing_keys_take_the_defaults() -> None:
    assert ChangeBegin.read({}) == ChangeBegin()
    assert TriggerRecord.read({}).ends is False
    assert TriggerRecord.read({"outcome": None}).ends  # an end that recorded no outcome
    assert EvidenceRecord.read({"label": "after"}).summary() == {"checks": []}
    assert RequestRecord.read({"by": "x", "nodes": []}).nodes is None


# -- the house rule: nothing outside rollout.change.record.entries reads a payload by string key
# ------

ALLOWED = {
    # a kind of change's own step payloads belong to its module (the module docstring says why):
    # the allocation-path change's steps, and its claim freeze's (landed after the typed record)
    "rollout/change/kinds/allocation_path.py",
    "rollout/change/kinds/claim_freeze.py",
}


def _payload_reads(tree: ast.AST) -> list[int]:
    """Lines that subscript or ``.get`` an entry's ``data`` (``e.data["x"]``, ``e.data.get``)."""
    out = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Subscript):
            target = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "items", "keys", "values")
        ):
            target = node.func.value
        if isinstance(target, ast.Attribute) and target.attr in ("data", "info"):
            out.append(node.lineno)
    return out


def test_no_module_but_entries_reads_a_journal_payload_by_key() -> None:
    found = {}
    for path in sorted(ROLLOUT.rglob("*.py")):
        rel = path.relative_to(ROLLOUT.parent).as_posix()
        if rel == "rollout/change/record/entries.py" or rel in ALLOWED:
            continue
        source = path.read_text()
        if "journal" not in source and "Entry" not in source and ".info" not in source:
            continue
        lines = _payload_reads(ast.parse(source))
        lines = [n for n in lines if "doc.data" not in source.splitlines()[n - 1]]
        if lines:
            found[rel] = lines
    assert found == {}
