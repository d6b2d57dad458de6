"""``rollout serve`` over real HTTP on 127.0.0.1, with a fake rollback trigger."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rollout.errors import ExternalError, InputError
from rollout.serve import AlertReceiver, make_server, parse_listen, read_token

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


def alert(
    fp: str = "abc123", change: str | None = "20261130-1200-aaaaaa", **labels: str
) -> dict[str, Any]:
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
    assert code == 200 and len(trigger.calls) == 1


def test_same_alert_twice_rolls_back_once(served: tuple[str, FakeTrigger, AlertReceiver]) -> None:
    url, trigger, _ = served
    code1, b1 = post(url + "/webhook", webhook(alert(node="lab-2")))
    code2, b2 = post(url + "/api/v2/alerts", [alert(node="lab-2")])
    assert (code1, code2) == (200, 200)
    assert [a["action"] for a in b1["alerts"] + b2["alerts"]] == ["rolled-back", "duplicate"]
    assert trigger.calls == [
        (
            "20261130-1200-aaaaaa",
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
        "rolled-back",
        "already-rolled-back",
        "ignored",
    ]
    assert len(trigger.calls) == 1


def test_failed_trigger_is_retried_on_the_next_delivery(
    served: tuple[str, FakeTrigger, AlertReceiver],
) -> None:
    url, trigger, _ = served
    trigger.fail_next = True
    code, body = post(url + "/webhook", webhook(alert()))
    assert code == 500 and "API server unreachable" in body["alerts"][0]["detail"]
    code, _ = post(url + "/webhook", webhook(alert()))
    assert code == 200 and len(trigger.calls) == 1


def test_a_slow_rollback_does_not_hold_the_next_delivery(
    served: tuple[str, FakeTrigger, AlertReceiver],
) -> None:
    # the first delivery's rollback is still running; the repeat is answered at once
    url, trigger, _ = served
    trigger.release.clear()
    first: list[Any] = []
    t = threading.Thread(target=lambda: first.append(post(url + "/webhook", webhook(alert()))))
    t.start()
    try:
        for _ in range(100):
            if trigger.calls:
                break
            threading.Event().wait(0.02)
        code, body = post(url + "/webhook", webhook(alert()))
        assert code == 200 and body["alerts"][0]["action"] == "duplicate"
    finally:
        trigger.release.set()
        t.join(5)
    assert first[0][1]["alerts"][0]["action"] == "rolled-back" and len(trigger.calls) == 1


def test_a_change_with_a_live_owner_is_handed_over(
    served: tuple[str, FakeTrigger, AlertReceiver],
) -> None:
    url, trigger, _ = served
    trigger.action = "handed-over"
    code, body = post(url + "/webhook", webhook(alert()))
    assert code == 200 and body["alerts"][0]["action"] == "handed-over"


def test_resolved_and_bad_payloads(served: tuple[str, FakeTrigger, AlertReceiver]) -> None:
    url, trigger, _ = served
    resolved = {**alert(), "status": "resolved"}
    _, body = post(url + "/webhook", webhook(resolved))
    assert body["alerts"][0]["action"] == "resolved"
    assert post(url + "/webhook", {"nope": 1})[0] == 400
    assert post(url + "/webhook", [1, 2])[0] == 400
    assert trigger.calls == []


def test_metrics_are_exposed(served: tuple[str, FakeTrigger, AlertReceiver]) -> None:
    url, _, receiver = served
    post(url + "/webhook", webhook(alert()))
    post(url + "/webhook", webhook(alert()), token=None)
    receiver.metrics.verdicts.labels(outcome="Failed").inc()
    receiver.metrics.set_node_state("lab-2", "rolled-back", ["applied", "rolled-back"])
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'rollout_rollbacks_total{trigger="webhook"} 1.0' in text
    assert 'rollout_webhook_requests_total{code="401"} 1.0' in text
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
