"""``rollout serve`` over real HTTP on 127.0.0.1, with a fake rollback trigger.

The bad-input, TLS and shutdown tests are in ``test_serve_hardening.py``."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rollout.errors import ExternalError, InputError
from rollout.gate.serve import AlertReceiver, TriggerRun, make_server, parse_listen, read_token

TOKEN = "s3cret-token"


class FakeTrigger:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...] | None, str]] = []
        self.fail_next = False
        self.action = "rolled-back"
        self.release = threading.Event()
        self.release.set()

    def __call__(self, change_id: str, nodes: Sequence[str] | None, reason: str) -> str:
        if self.fail_next:
            self.fail_next = False
            raise ExternalError("API server unreachable")
        self.calls.append((change_id, tuple(nodes) if nodes else None, reason))
        self.release.wait(5)
        return self.action


@pytest.fixture
def served() -> Iterator[tuple[str, FakeTrigger, AlertReceiver]]:
    trigger = FakeTrigger()
    receiver = AlertReceiver(trigger)
    server = make_server(("127.0.0.1", 0), TOKEN, receiver)
    t = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", trigger, receiver
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def post(url: str, body: Any, token: str | None = TOKEN) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url: str, token: str | None = TOKEN) -> tuple[int, Any]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def settled(receiver: AlertReceiver, timeout: float = 5) -> list[TriggerRun]:
    """Every rollback the receiver started, once none is running any more."""
    deadline = time.monotonic() + timeout
    while any(r.state == "running" for r in receiver.runs()):
        assert time.monotonic() < deadline, receiver.runs()
        time.sleep(0.01)
    return receiver.runs()


CHANGE = "20261130T120000Z-aaaaaa"


def alert(fp: str = "abc123", change: str | None = CHANGE, **labels: str) -> dict[str, Any]:
    lab = {"alertname": "KubeletTopologyAffinityRejections", **labels}
    if change:
        lab["change_id"] = change
    return {"status": "firing", "labels": lab, "annotations": {}, "fingerprint": fp}


def webhook(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "rollout", "alerts": list(alerts)}


@pytest.mark.parametrize("token", [None, "wrong", ""])
def test_without_the_token_401_and_nothing_happens(
    served: tuple[str, FakeTrigger, AlertReceiver], token: str | None
) -> None:
    url, trigger, _ = served
    code, body = post(url + "/webhook", webhook(alert()), token=token)
    assert code == 401 and "token" in body["error"]
    assert trigger.calls == []
    # ... and the dedup memory is untouched: the authenticated delivery still rolls back
    code, _ = post(url + "/webhook", webhook(alert()))
    assert code == 202 and [r.state for r in settled(served[2])] == ["rolled-back"]
    assert len(trigger.calls) == 1


def test_same_alert_twice_rolls_back_once(served: tuple[str, FakeTrigger, AlertReceiver]) -> None:
    url, trigger, receiver = served
    code1, b1 = post(url + "/webhook", webhook(alert(node="lab-2")))
    code2, b2 = post(url + "/api/v2/alerts", [alert(node="lab-2")])
    assert (code1, code2) == (202, 200)
    assert [a["action"] for a in b1["alerts"] + b2["alerts"]] == ["triggered", "duplicate"]
    assert b1["alerts"][0]["trigger"] == settled(receiver)[0].id
    assert trigger.calls == [
        (
            CHANGE,
            ("lab-2",),
            "alert abc123 (KubeletTopologyAffinityRejections)",
        )
    ]


def test_second_alert_for_the_same_change_does_not_roll_back_again(
    served: tuple[str, FakeTrigger, AlertReceiver],
) -> None:
    url, trigger, _ = served
    _, body = post(url + "/webhook", webhook(alert("fp1"), alert("fp2"), alert("fp3", change=None)))
    assert [a["action"] for a in body["alerts"]] == [
        "triggered",
        "already-rolled-back",
        "ignored",
    ]
    settled(served[2])
    assert len(trigger.calls) == 1


def test_failed_trigger_is_retried_on_the_next_delivery(
    served: tuple[str, FakeTrigger, AlertReceiver],
) -> None:
    url, trigger, receiver = served
    trigger.fail_next = True
    code, body = post(url + "/webhook", webhook(alert()))
    assert code == 202, body
    (run,) = settled(receiver)
    assert run.state == "failed" and "API server unreachable" in run.detail
    code, body = post(url + "/webhook", webhook(alert()))  # forgotten: the next one retries
    assert code == 202 and body["alerts"][0]["action"] == "triggered", body
    assert [r.state for r in settled(receiver)] == ["failed", "rolled-back"]
    assert len(trigger.calls) == 1
    text = receiver.metrics.exposition().decode()
    assert 'rollout_webhook_rollbacks_total{outcome="failed"} 1.0' in text
    assert 'rollout_webhook_rollbacks_total{outcome="rolled-back"} 1.0' in text


def test_the_webhook_answers_202_at_once_while_the_rollback_runs(
    served: tuple[str, FakeTrigger, AlertReceiver],
) -> None:
    # the rollback is still running (held): the delivery is answered with its trigger id, the
    # repeat is a duplicate, the trigger reads "running", then its outcome
    url, trigger, receiver = served
    trigger.release.clear()
    try:
        t0 = time.monotonic()
        code, body = post(url + "/webhook", webhook(alert()))
        assert code == 202 and time.monotonic() - t0 < 2, body
        tid = body["alerts"][0]["trigger"]
        code, body = post(url + "/webhook", webhook(alert()))
        assert code == 200 and body["alerts"][0]["action"] == "duplicate"
        code, doc = get(url + f"/triggers/{tid}")
        assert code == 200 and doc["state"] == "running" and doc["change"] == CHANGE, doc
        assert "rollout_webhook_rollbacks_running 1.0" in receiver.metrics.exposition().decode()
    finally:
        trigger.release.set()
    assert [r.state for r in settled(receiver)] == ["rolled-back"]
    code, doc = get(url + f"/triggers/{tid}")
    assert doc["state"] == "rolled-back" and doc["ended"] >= doc["started"]
    assert get(url + f"/triggers/{tid}", token=None)[0] == 401
    assert get(url + "/triggers/nope")[0] == 404
    assert "rollout_webhook_rollbacks_running 0.0" in receiver.metrics.exposition().decode()


def test_a_change_with_a_live_owner_is_handed_over(
    served: tuple[str, FakeTrigger, AlertReceiver],
) -> None:
    url, trigger, receiver = served
    trigger.action = "handed-over"
    code, body = post(url + "/webhook", webhook(alert()))
    assert code == 202 and body["alerts"][0]["action"] == "triggered"
    assert [r.state for r in settled(receiver)] == ["handed-over"]


def test_resolved_and_bad_payloads(served: tuple[str, FakeTrigger, AlertReceiver]) -> None:
    url, trigger, _ = served
    resolved = {**alert(), "status": "resolved"}
    _, body = post(url + "/webhook", webhook(resolved))
    assert body["alerts"][0]["action"] == "resolved"
    code, body = post(url + "/webhook", {"nope": 1})
    assert code == 400 and body["field"] == "nope" and "unknown field" in body["error"]
    code, body = post(url + "/webhook", [1, 2])
    assert code == 400 and body["field"] == "[0]", body
    assert trigger.calls == []


def test_metrics_are_exposed(served: tuple[str, FakeTrigger, AlertReceiver]) -> None:
    url, _, receiver = served
    post(url + "/webhook", webhook(alert()))
    post(url + "/webhook", webhook(alert()), token=None)
    settled(receiver)
    receiver.metrics.verdicts.labels(outcome="Failed").inc()
    receiver.metrics.set_node_state("lab-2", "rolled-back", ["applied", "rolled-back"])
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'rollout_rollbacks_total{trigger="webhook"} 1.0' in text
    assert 'rollout_webhook_requests_total{code="401"} 1.0' in text
    assert 'rollout_webhook_requests_total{code="202"} 1.0' in text
    assert 'rollout_webhook_rollbacks_total{outcome="rolled-back"} 1.0' in text
    assert 'rollout_gate_verdicts_total{outcome="Failed"} 1.0' in text
    assert 'rollout_node_state{node="lab-2",state="rolled-back"} 1.0' in text
    assert 'rollout_node_state{node="lab-2",state="applied"} 0.0' in text


def test_token_file_and_listen_parsing(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    assert read_token(f) == TOKEN
    f.write_text("  \n")
    with pytest.raises(InputError, match="empty"):
        read_token(f)
    with pytest.raises(InputError, match="cannot read"):
        read_token(tmp_path / "missing")
    assert parse_listen("127.0.0.1:9099") == ("127.0.0.1", 9099)
    with pytest.raises(InputError, match="HOST:PORT"):
        parse_listen("9099")


# ------------------------------------------------------------------ alerts by node (journals)


def _journal(root: Path, cid: str, node_states: dict[str, str], plan: Path | None = None) -> None:
    """A real journal on disk: begin, then the steps each node went through."""
    from datetime import UTC, datetime

    from rollout.change.record.journal import CHANGE_STEP, Journal
    from rollout.models import Phase, Step, StepPath

    j = Journal.create(root, cid)
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    info: dict[str, Any] = {"nodes": list(node_states), "batches": [list(node_states)]}
    if plan is not None:
        info["plan"] = str(plan)
    j.append(CHANGE_STEP, Phase.BEGIN, now=now, data=info)
    for node, state in node_states.items():
        if state == "pending":
            continue
        j.append(Step.CORDON, Phase.BEGIN, now=now, node=node)
        if state in ("applied", "restoring", "restored"):
            j.append(Step.UNCORDON, Phase.DONE, now=now, node=node)
        if state in ("restoring", "restored"):
            j.append(Step.RESTORE, Phase.BEGIN, now=now, node=node, path=StepPath.RESTORE)
        if state == "restored":
            j.append(Step.UNCORDON, Phase.DONE, now=now, node=node, path=StepPath.RESTORE)


@pytest.fixture
def by_node(tmp_path: Path) -> Iterator[tuple[str, FakeTrigger, AlertReceiver, Path]]:
    from rollout.gate.owning import JournalOwners, journal_recorder

    root = tmp_path / "state"
    trigger = FakeTrigger()
    lines: list[str] = []
    receiver = AlertReceiver(
        trigger,
        owners=JournalOwners(root, lambda: None),
        record=journal_recorder(root),
        log=lines.append,
    )
    server = make_server(("127.0.0.1", 0), TOKEN, receiver)
    t = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", trigger, receiver, root
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)
    assert lines  # every alert handled was logged


A = "20261130T100000Z-aaaaaa"
B = "20261130T110000Z-bbbbbb"


def test_alert_on_a_node_rolls_back_the_change_owning_it(
    by_node: tuple[str, FakeTrigger, AlertReceiver, Path],
) -> None:
    from rollout.change.record.journal import Journal

    url, trigger, receiver, root = by_node
    _journal(root, A, {"n1": "restored", "n2": "applied"})
    _journal(root, B, {"n1": "applied", "n3": "pending"})
    code, body = post(url + "/webhook", webhook(alert("fp1", change=None, node="n1")))
    assert code == 202 and body["alerts"][0]["action"] == "triggered"
    (run,) = settled(receiver)
    assert trigger.calls == [(B, ("n1",), "alert fp1 (KubeletTopologyAffinityRejections)")]
    # the trigger record names the alert, in the owning change's journal, before the rollback;
    # a second one, with the same trigger id, its outcome
    rec = [e for e in Journal.open(root, B).entries() if e.step == "trigger"]
    assert len(rec) == 2
    assert rec[0].data["alert"] == "KubeletTopologyAffinityRejections"
    assert rec[0].data["trigger"] == "alert" and rec[0].data["nodes"] == ["n1"]
    assert rec[0].data["id"] == rec[1].data["id"] == run.id == body["alerts"][0]["trigger"]
    assert rec[1].data["outcome"] == "rolled-back" and "outcome" not in rec[0].data
    assert not [e for e in Journal.open(root, A).entries() if e.step == "trigger"]
    # repeat notification, a second rule firing for the same node: nothing more
    _, body = post(url + "/webhook", webhook(alert("fp1", change=None, node="n1")))
    _, body2 = post(
        url + "/webhook",
        webhook(
            {
                **alert("fp2", change=None, node="n1"),
                "labels": {"alertname": "KubeletTopologyManagerAdmissionErrors", "node": "n1"},
            }
        ),
    )
    assert body["alerts"][0]["action"] == "duplicate"
    assert body2["alerts"][0]["action"] == "already-rolled-back"
    assert len(trigger.calls) == 1
    assert len([e for e in Journal.open(root, B).entries() if e.step == "trigger"]) == 2
    # an older change's node (n2 is still A's) is its own rollback
    post(url + "/webhook", webhook(alert("fp3", change=None, node="n2")))
    settled(receiver)
    assert trigger.calls[-1][:2] == (A, ("n2",))


@pytest.mark.parametrize("node", ["n9", "n3", "n4"])  # unknown, pending, restored
def test_alert_on_a_node_no_change_owns_is_422_counted_and_changes_nothing(
    by_node: tuple[str, FakeTrigger, AlertReceiver, Path], node: str
) -> None:
    url, trigger, receiver, root = by_node
    _journal(root, B, {"n1": "applied", "n3": "pending", "n4": "restored"})
    code, body = post(url + "/webhook", webhook(alert("fp", change=None, node=node)))
    assert code == 422 and body["alerts"][0]["action"] == "unowned"
    assert body["error"] == f"alerts[0]: no change owns node {node} now", body
    assert trigger.calls == []
    text = receiver.metrics.exposition().decode()
    assert 'rollout_webhook_alerts_total{action="unowned"} 1.0' in text
    from rollout.change.record.journal import Journal

    assert not [e for e in Journal.open(root, B).entries() if e.step == "trigger"]


def test_a_cluster_record_that_cannot_be_read_is_a_500_not_unowned(tmp_path: Path) -> None:
    """When the Node's change cannot be fetched and no journal here names the node, the answer
    is "failed" (500, so Alertmanager delivers again), never the final "unowned"; a node a local
    journal names is still decided from it."""
    from rollout.errors import RolloutError
    from rollout.gate.owning import JournalOwners

    root = tmp_path / "state"

    def refresh(node: str) -> None:
        raise RolloutError("read node n1: timed out")

    trigger = FakeTrigger()
    receiver = AlertReceiver(trigger, owners=JournalOwners(root, lambda: None, refresh))
    server = make_server(("127.0.0.1", 0), TOKEN, receiver)
    t = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        code, body = post(url + "/webhook", webhook(alert("fp", change=None, node="n1")))
        assert code == 500, body
        (out,) = body["alerts"]
        assert out["action"] == "failed" and "timed out" in out["detail"], out
        assert trigger.calls == []
        # the next delivery, with a journal here that names the node: decided from it
        _journal(root, B, {"n1": "applied"})
        code, body = post(url + "/webhook", webhook(alert("fp", change=None, node="n1")))
        assert code == 202 and body["alerts"][0]["action"] == "triggered", body
        settled(receiver)
        assert trigger.calls[0][:2] == (B, ("n1",))
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def test_a_node_being_restored_is_not_rolled_back_twice(
    by_node: tuple[str, FakeTrigger, AlertReceiver, Path],
) -> None:
    url, trigger, _, root = by_node
    _journal(root, A, {"n1": "restoring"})
    _, body = post(url + "/webhook", webhook(alert("fp", change=None, node="n1")))
    assert body["alerts"][0]["action"] == "already-rolled-back"
    assert trigger.calls == []


def test_rollback_group_plan_rolls_back_the_batch(
    by_node: tuple[str, FakeTrigger, AlertReceiver, Path], tmp_path: Path
) -> None:
    url, trigger, receiver, root = by_node
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "apiVersion: rollout.dev/v1alpha1\nkind: RolloutPlan\nmetadata:\n  name: p\n"
        'kubelet:\n  cpuManagerPolicy: static\n  reservedSystemCPUs: "0"\n'
        "gate:\n  onFailure: rollback-group\n"
    )
    _journal(root, A, {"n1": "applied", "n2": "applied"}, plan=plan)
    _, body = post(url + "/webhook", webhook(alert("fp", change=None, node="n2")))
    assert body["alerts"][0]["action"] == "triggered", body
    settled(receiver)
    assert trigger.calls[0][:2] == (A, ("n1", "n2"))
    # then an alert on n1 (same batch) is already handled
    _, body = post(url + "/webhook", webhook(alert("fp2", change=None, node="n1")))
    assert body["alerts"][0]["action"] == "already-rolled-back"
    assert len(trigger.calls) == 1


def test_node_states_come_from_the_newest_change_touching_each_node(tmp_path: Path) -> None:
    from rollout.gate.owning import export_node_states, node_states
    from rollout.gate.serve import GateMetrics

    root = tmp_path / "state"
    _journal(root, A, {"n1": "applied", "n2": "applied"})
    _journal(root, B, {"n1": "restored", "n3": "pending"})
    assert node_states(root) == {"n1": "restored", "n2": "applied"}
    m = GateMetrics()
    export_node_states(root)(m)
    text = m.exposition().decode()
    assert 'rollout_node_state{node="n1",state="restored"} 1.0' in text
    assert 'rollout_node_state{node="n1",state="applied"} 0.0' in text
    assert 'rollout_node_state{node="n2",state="applied"} 1.0' in text
    assert 'node="n3"' not in text


def test_repeats_after_the_rollback_finished_are_duplicates(
    by_node: tuple[str, FakeTrigger, AlertReceiver, Path],
) -> None:
    import shutil

    url, trigger, receiver, root = by_node
    _journal(root, A, {"n1": "applied"})
    post(url + "/webhook", webhook(alert("fp1", change=None, node="n1")))
    settled(receiver)
    shutil.rmtree(root / "changes" / A)  # the rollback finished: n1 restored
    _journal(root, A, {"n1": "restored"})
    _, body = post(url + "/webhook", webhook(alert("fp1", change=None, node="n1")))
    _, body2 = post(url + "/webhook", webhook(alert("fp2", change=None, node="n1")))
    assert body["alerts"][0]["action"] == "duplicate"
    assert body2["alerts"][0]["action"] == "unowned"  # nothing of A's is on n1 any more
    assert len(trigger.calls) == 1


def test_the_triggers_and_their_outcomes_are_in_the_changes_status(
    by_node: tuple[str, FakeTrigger, AlertReceiver, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from rollout.change.record.journal import Journal
    from rollout.change.record.replay import replay
    from rollout.cli.wiring import print_status

    url, _, receiver, root = by_node
    _journal(root, A, {"n1": "applied"})
    _, body = post(url + "/webhook", webhook(alert("fp1", change=None, node="n1")))
    (run,) = settled(receiver)
    status = replay(Journal.open(root, A).entries(), A)
    (t,) = status.triggers
    assert t.id == run.id == body["alerts"][0]["trigger"]
    assert t.trigger == "alert" and t.alert == "KubeletTopologyAffinityRejections"
    assert t.nodes == ("n1",) and t.outcome == "rolled-back" and str(t.ended) >= t.at
    shown = status.to_dict()["triggers"]
    assert shown == [t.to_dict()] and shown[0]["nodes"] == ["n1"] and shown[0]["id"] == run.id
    print_status(status, "text")
    line = next(x for x in capsys.readouterr().out.splitlines() if "rollback asked by" in x)
    assert line.startswith(
        f"  rollback asked by alert KubeletTopologyAffinityRejections (trigger {run.id}) at "
    )
    assert line.endswith("for n1: rolled-back"), line
