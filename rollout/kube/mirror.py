"""A change's record in the cluster: ConfigMaps in the lock namespace and annotations on its Nodes.

Why: the journal and the backups (the original bytes a rollback writes back) used to live only on
the machine that ran ``apply``. If that disk is lost mid-soak, nothing could list, roll back or
resume the change. So every journal append and every backup is also written here, and any machine
with the kubeconfig rebuilds its local cache from these objects
(``rollout.change.record.cluster_mirror``).

Objects, all labelled ``rollout.dev/change=<id>`` and ``app.kubernetes.io/managed-by=rollout``:

* ``rollout-journal-<id>-<n>`` (label ``rollout.dev/record=journal``, annotation
  ``rollout.dev/chunk=<n>``): chunk ``n`` of ``journal.jsonl``, whole lines, at most
  :data:`CHUNK_BYTES` each (an object must stay under the API server's 1 MiB limit; a 5,000-node
  change is about a hundred chunks);
* ``rollout-backup-<id>-<hash>`` (label ``rollout.dev/record=backup``, annotations
  ``rollout.dev/node`` and ``rollout.dev/sha256``): one original file's bytes in ``binaryData``.

Each changed Node carries ``rollout.dev/change``, ``rollout.dev/intent`` (the plan's intent digest)
and ``rollout.dev/state`` (``applying``, ``applied``, ``restoring``, ``restored``, ``failed``), so
``kubectl get nodes -L rollout.dev/change -L rollout.dev/state`` answers which node runs which
change. Annotations are not selectable by ``-L``; the state and change are labels too.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from rollout.kube.client import RETRY_S, Api, call

CHUNK_BYTES = 256 * 1024
"""The most journal bytes per ConfigMap (whole lines; a single longer line gets its own chunk)."""

MAX_BACKUP_BYTES = 900 * 1024
"""A backed-up file larger than this cannot be mirrored in one ConfigMap (kubelet configs are a
few KiB); the mirror reports it instead."""

WRITE_RETRY_S = 2.0
WRITE_TIMEOUT_S = 5.0
"""A mirror write retries transient failures this long, each request this long at most: the
record is best effort and must not hold a node step through an API outage (the step's own calls
wait for the API server as before)."""

CHANGE_KEY = "rollout.dev/change"
INTENT_KEY = "rollout.dev/intent"
STATE_KEY = "rollout.dev/state"
RECORD_KEY = "rollout.dev/record"
CHUNK_KEY = "rollout.dev/chunk"
NODE_KEY = "rollout.dev/node"
SHA_KEY = "rollout.dev/sha256"
MANAGED_BY = {"app.kubernetes.io/managed-by": "rollout"}


_WRITE: dict[str, Any] = {"retry_s": WRITE_RETRY_S, "_request_timeout": WRITE_TIMEOUT_S}


def _dns(change_id: str) -> str:
    return change_id.lower()


def journal_name(change_id: str, index: int) -> str:
    """The ConfigMap name of journal chunk ``index``."""
    return f"rollout-journal-{_dns(change_id)}-{index}"


def backup_name(change_id: str, node: str, digest: str) -> str:
    """The ConfigMap name of one backup (node names can be long: a hash of node and digest)."""
    key = hashlib.sha256(f"{node}/{digest}".encode()).hexdigest()[:20]
    return f"rollout-backup-{_dns(change_id)}-{key}"


def _put(api: Api, namespace: str, body: dict[str, Any], exists: bool = False) -> None:
    """Create the ConfigMap, or replace it when it exists (``exists``: replace first, one
    request in the common case of a chunk rewritten after each append)."""
    name = body["metadata"]["name"]

    def create() -> None:
        call(
            f"create configmap {name}",
            api.core.create_namespaced_config_map,
            namespace,
            body,
            **_WRITE,
        )

    def replace() -> None:
        call(
            f"replace configmap {name}",
            api.core.replace_namespaced_config_map,
            name,
            namespace,
            body,
            **_WRITE,
        )

    first, second, status = (replace, create, 404) if exists else (create, replace, 409)
    try:
        first()
    except Exception as e:
        if getattr(e, "status", None) != status:
            raise
        second()


def journal_chunk(change_id: str, index: int, data: bytes) -> dict[str, Any]:
    """The ConfigMap of journal chunk ``index`` (whole JSON lines, UTF-8). The chunk index is a
    label too, so :func:`latest_change` lists only each change's first chunk."""
    labels = {**MANAGED_BY, CHANGE_KEY: change_id, RECORD_KEY: "journal", CHUNK_KEY: str(index)}
    return {
        "metadata": {
            "name": journal_name(change_id, index),
            "labels": labels,
            "annotations": {CHUNK_KEY: str(index)},
        },
        "data": {"journal.jsonl": data.decode()},
    }


def put_journal_chunk(
    api: Api, namespace: str, change_id: str, index: int, data: bytes, exists: bool = False
) -> None:
    """Write journal chunk ``index``; ``exists``: written before."""
    _put(api, namespace, journal_chunk(change_id, index, data), exists)


def put_backup(
    api: Api, namespace: str, change_id: str, node: str, digest: str, content: bytes
) -> None:
    """Write one backup's original bytes.

    Raises:
        ValueError: the file is larger than :data:`MAX_BACKUP_BYTES`.
    """
    if len(content) > MAX_BACKUP_BYTES:
        raise ValueError(f"{len(content)} bytes is over the {MAX_BACKUP_BYTES}-byte object limit")
    _put(
        api,
        namespace,
        {
            "metadata": {
                "name": backup_name(change_id, node, digest),
                "labels": {**MANAGED_BY, CHANGE_KEY: change_id, RECORD_KEY: "backup"},
                "annotations": {NODE_KEY: node, SHA_KEY: digest},
            },
            "binaryData": {"content": base64.b64encode(content).decode()},
        },
    )


def annotate_node(api: Api, node: str, change_id: str, intent: str, state: str) -> None:
    """Mark a Node with the change, its intent digest and the node's state in it (a merge patch
    of metadata only; the state and change are also labels, for ``kubectl get nodes -L``)."""
    marks = {CHANGE_KEY: change_id, INTENT_KEY: intent, STATE_KEY: state}
    labels = {CHANGE_KEY: change_id, STATE_KEY: state}
    call(
        f"annotate node {node}",
        api.core.patch_node,
        node,
        {"metadata": {"annotations": marks, "labels": labels}},
        **_WRITE,
    )


def _items(
    api: Api, namespace: str, selector: str, retry_s: float = RETRY_S
) -> list[dict[str, Any]]:
    answer = call(
        f"list configmaps {selector}",
        api.core.list_namespaced_config_map,
        namespace,
        label_selector=selector,
        retry_s=retry_s,
    )
    return list(answer.get("items") or [])


def fetch_journal(
    api: Api, namespace: str, change_id: str, retry_s: float = RETRY_S
) -> bytes | None:
    """The mirrored journal of a change (its chunks joined in order), or None when the cluster
    has none. The backups are not read: most callers only compare journals."""
    selector = f"{CHANGE_KEY}={change_id},{RECORD_KEY}=journal"
    chunks: dict[int, str] = {}
    for cm in _items(api, namespace, selector, retry_s):
        notes = (cm.get("metadata") or {}).get("annotations") or {}
        chunks[int(notes[CHUNK_KEY])] = str((cm.get("data") or {}).get("journal.jsonl", ""))
    if not chunks:
        return None
    return "".join(chunks[i] for i in sorted(chunks)).encode()


def fetch_backups(
    api: Api, namespace: str, change_id: str, retry_s: float = RETRY_S
) -> list[tuple[str, str, bytes]]:
    """The mirrored backups of a change: ``(node, sha256, bytes)``."""
    out = []
    for cm in _items(api, namespace, f"{CHANGE_KEY}={change_id},{RECORD_KEY}=backup", retry_s):
        notes = (cm.get("metadata") or {}).get("annotations") or {}
        raw = base64.b64decode((cm.get("binaryData") or {}).get("content", ""))
        out.append((str(notes[NODE_KEY]), str(notes[SHA_KEY]), raw))
    return out


def fetch(
    api: Api, namespace: str, change_id: str, retry_s: float = RETRY_S
) -> tuple[bytes, list[tuple[str, str, bytes]]] | None:
    """The mirrored journal and backups of a change, or None when the cluster has no journal
    for it."""
    data = fetch_journal(api, namespace, change_id, retry_s)
    if data is None:
        return None
    return data, fetch_backups(api, namespace, change_id, retry_s)


def latest_change(api: Api, namespace: str, retry_s: float = RETRY_S) -> str | None:
    """The most recent change id with a journal in the cluster (ids sort by start time); only
    each change's first chunk is listed, not every journal in full."""
    ids = {
        str((cm.get("metadata") or {}).get("labels", {}).get(CHANGE_KEY))
        for cm in _items(api, namespace, f"{RECORD_KEY}=journal,{CHUNK_KEY}=0", retry_s)
    }
    ids.discard("None")
    return max(ids) if ids else None


def first_chunks(api: Api, namespace: str, retry_s: float = RETRY_S) -> dict[str, str]:
    """Each change's first journal chunk (its ``begin`` is there), by change id: what
    ``rollout.change.commands.stages`` reads to find a staged plan's earlier changes without
    fetching every journal in full."""
    out: dict[str, str] = {}
    for cm in _items(api, namespace, f"{RECORD_KEY}=journal,{CHUNK_KEY}=0", retry_s):
        change = (cm.get("metadata") or {}).get("labels", {}).get(CHANGE_KEY)
        if change:
            out[str(change)] = str((cm.get("data") or {}).get("journal.jsonl", ""))
    return out


def node_change(api: Api, node: str) -> str | None:
    """The change a Node's ``rollout.dev/change`` label names (None: no such label)."""
    body = call(f"read node {node}", api.core.read_node, node, retry_s=2.0)
    labels = (body.get("metadata") or {}).get("labels") or {}
    value = labels.get(CHANGE_KEY)
    return str(value) if value else None


def marked_nodes(api: Api, retry_s: float = 2.0) -> dict[str, dict[str, str]]:
    """Every Node a change marked: name -> ``{"change", "intent", "state"}`` (its labels and
    annotations), in the API's order."""
    answer = call("list nodes", api.core.list_node, label_selector=CHANGE_KEY, retry_s=retry_s)
    out: dict[str, dict[str, str]] = {}
    for item in answer.get("items") or []:
        meta = item.get("metadata") or {}
        labels = meta.get("labels") or {}
        notes = meta.get("annotations") or {}
        out[str(meta.get("name"))] = {
            "change": str(notes.get(CHANGE_KEY) or labels.get(CHANGE_KEY) or ""),
            "intent": str(notes.get(INTENT_KEY) or ""),
            "state": str(notes.get(STATE_KEY) or labels.get(STATE_KEY) or ""),
        }
    return out


def node_states(api: Api) -> dict[str, str]:
    """Every Node a change marked: its state in the change that last wrote it."""
    return {n: m["state"] for n, m in marked_nodes(api).items() if m["state"]}
