"""A cluster-wide freeze of new ResourceClaims for the pool's DeviceClass while a migration's
nodes go back to the device plugin (the plan's ``allocationPath.freezeClaims``, default off).

Why: the design document's rollback order starts with *stop new Claims*. A cordon stops new
claims on the node's own pool only (the scheduler allocates for a chosen node, and a cordoned
node is not chosen); a pool rolled back node by node still takes new claims on its other nodes,
and a claim created now may be allocated from a node the rollback reaches next. Where the plan
asks for it, every restore of a node moved to DRA is bracketed by a ValidatingAdmissionPolicy
and its binding (rendered here, in the style of ``rollout tenancy render``) that deny creating a
ResourceClaim or a ResourceClaimTemplate that requests the DeviceClass, in ``exactly`` or any
``firstAvailable`` alternative, in every namespace and from every requester: the claims the
scheduler creates for a pod's extended resource (KEP-5004) and the resource-claim controller
creates from templates are judged too, so those pods wait Pending with the policy's message.

The freeze is a change-level journal entry of its own (``claim-freeze``: ``begin`` and ``done``
of ``apply``, then of ``remove``). It is applied before the first node's cordon and is
``done`` only once the API server refuses a server-side dry-run claim of the class with the
policy's name (a policy takes effect when the API server's informer has it). It is removed when
the restore ends, and, whatever ended a process, by the next one: any end of the change
(``rollout resume``, ``rollout rollback`` from another machine) removes a freeze the journal
shows applied and not removed. Both writes are idempotent (server-side apply; delete where
present).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from rollout.change.engine.context import Context
from rollout.change.record.journal import Entry, Kind
from rollout.errors import InputError, NodeOperationError
from rollout.models import Phase
from rollout.retrying import Poll, wait_until

PREFIX = "rollout-claim-freeze."
"""The policy's and the binding's name: this prefix and the DeviceClass's name."""
GROUP = "admissionregistration.k8s.io/v1"
PROBE_NAMESPACE = "default"
"""Where the dry-run claim that proves the freeze is in force is sent (nothing is stored)."""
APPLY, REMOVE = "apply", "remove"


def name_of(device_class: str) -> str:
    """The policy's and the binding's name for ``device_class``."""
    return PREFIX + device_class


def message_of(device_class: str, change: str) -> str:
    """What a refused requester reads (after the API server's own prefix)."""
    return (
        f"new ResourceClaims for DeviceClass {device_class} are frozen while rollout moves "
        f"the GPU pool back to the device plugin (change {change}); retry once the rollback "
        "has ended"
    )


def _cel(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def render(device_class: str, change: str) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding (every namespace, ``Deny``) that freeze new
    claims and claim templates of ``device_class`` (pure)."""
    name = name_of(device_class)
    labels = {"app.kubernetes.io/managed-by": "rollout"}
    annotations = {
        "rollout.dev/change": change,
        "rollout.dev/why": "the design's rollback order: stop new Claims "
        "(allocationPath.freezeClaims)",
    }
    cls = _cel(device_class)
    policy = {
        "apiVersion": GROUP,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["resourceclaims", "resourceclaimtemplates"],
                    }
                ],
            },
            "variables": [
                {
                    "name": "spec",
                    "expression": "request.kind.kind == 'ResourceClaimTemplate' ? "
                    "object.spec.spec : object.spec",
                },
                {"name": "requests", "expression": "variables.spec.?devices.?requests.orValue([])"},
            ],
            "validations": [
                {
                    "expression": "!variables.requests.exists(r, has(r.exactly) ? "
                    f"r.exactly.deviceClassName == {cls} : "
                    f"r.?firstAvailable.orValue([]).exists(s, s.deviceClassName == {cls}))",
                    "message": message_of(device_class, change),
                    "reason": "Forbidden",
                }
            ],
        },
    }
    binding = {
        "apiVersion": GROUP,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def probe_claim(device_class: str) -> dict[str, Any]:
    """The claim whose server-side dry-run create proves the freeze in force (never stored)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"generateName": "rollout-claim-freeze-probe-", "namespace": PROBE_NAMESPACE},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
        },
    }


@runtime_checkable
class FreezeWorld(Protocol):
    """The API calls of the freeze (the context's cluster has them: ``KubeCluster``)."""

    def apply_objects(self, objects: Sequence[Mapping[str, Any]]) -> None:
        """Server-side apply each object (a ValidatingAdmissionPolicy or its binding)."""
        ...

    def delete_object(self, kind: str, name: str) -> bool:
        """Delete the cluster-scoped object; False when there was none."""
        ...

    def dry_run_create(self, obj: Mapping[str, Any]) -> str | None:
        """A server-side dry-run create of the namespaced ``obj``: the API server's refusal
        message, or None when it would have been created."""
        ...


def applied(entries: Sequence[Entry]) -> dict[str, Any] | None:
    """The freeze the journal shows applied (its ``apply`` begun, ended or not) and not yet
    removed (pure): the data of its ``apply`` entry, or None."""
    state: dict[str, Any] | None = None
    for e in entries:
        if e.node is not None or e.step != Kind.CLAIM_FREEZE:
            continue
        action = e.data.get("action")
        if action == APPLY and e.phase is not Phase.FAILED:
            state = dict(e.data)
        elif action == REMOVE and e.phase is Phase.DONE:
            state = None
    return state


def wanted(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The DeviceClass to freeze for the restores of nodes with these journal records (pure):
    a node moved to DRA whose recorded settings ask for the freeze; None: no freeze."""
    for rec in records:
        settings = rec.get("settings") or {}
        if rec.get("target") == "dra" and settings.get("freeze_claims"):
            return str(settings.get("device_class"))
    return None


_lock = threading.Lock()  # the freeze's bracket, across the restores a process runs side by side


def _world(ctx: Context) -> FreezeWorld:
    if not isinstance(ctx.cluster, FreezeWorld):
        raise InputError("the claim freeze needs a cluster that writes admission policies")
    return ctx.cluster


def _append(ctx: Context, phase: Phase, data: Mapping[str, Any]) -> None:
    ctx.journal.append(Kind.CLAIM_FREEZE, phase, now=ctx.clock.now(), data=data)


def freeze(ctx: Context, device_class: str, timeout_s: float, poll_s: float = 0.5) -> None:
    """Apply the freeze and wait until the API server enforces it (journaled before and after;
    idempotent).

    Raises:
        NodeOperationError: the objects could not be written, or a dry-run claim of the class was
            still admitted after ``timeout_s`` (journaled ``failed``; nothing else was done).
    """
    world = _world(ctx)
    change = ctx.journal.change_id
    name = name_of(device_class)
    data = {"action": APPLY, "deviceClass": device_class, "policy": name, "binding": name}
    _append(ctx, Phase.BEGIN, data)
    ctx.on_event(f"freezing new ResourceClaims of DeviceClass {device_class} ({name})")
    try:
        world.apply_objects(render(device_class, change))
        refusal: str | None = None

        def refused_by_ours() -> bool:
            nonlocal refusal
            refusal = world.dry_run_create(probe_claim(device_class))
            return refusal is not None and f"'{name}'" in refusal

        poll = Poll.every(poll_s)
        if not wait_until(refused_by_ours, timeout_s, poll, ctx.clock.sleep, ctx.clock.monotonic):
            what = f"refused by something else: {refusal}" if refusal else "admitted"
            raise NodeOperationError(
                f"a dry-run ResourceClaim of DeviceClass {device_class} was still {what} "
                f"{timeout_s:g}s after ValidatingAdmissionPolicy {name} was applied"
            )
    except Exception as e:
        _append(ctx, Phase.FAILED, {**data, "message": str(e)})
        raise NodeOperationError(f"claim freeze of DeviceClass {device_class}: {e}") from e
    _append(ctx, Phase.DONE, {**data, "refusal": refusal})


def thaw(ctx: Context, state: Mapping[str, Any]) -> None:
    """Remove the freeze ``state`` names (binding first, then policy; journaled before and
    after; idempotent: objects already gone are fine). A failure is journaled and said, never
    raised: the next end of the change removes it."""
    world = _world(ctx)
    name = str(state.get("policy"))
    data = {"action": REMOVE, "deviceClass": state.get("deviceClass"), "policy": name}
    _append(ctx, Phase.BEGIN, data)
    try:
        gone = [
            world.delete_object("ValidatingAdmissionPolicyBinding", str(state.get("binding"))),
            world.delete_object("ValidatingAdmissionPolicy", name),
        ]
    except Exception as e:
        _append(ctx, Phase.FAILED, {**data, "message": str(e)})
        ctx.on_event(f"could not remove the claim freeze {name}: {e}; `rollout resume` does")
        return
    _append(ctx, Phase.DONE, {**data, "deleted": gone})
    ctx.on_event(f"new ResourceClaims of DeviceClass {state.get('deviceClass')} admitted again")


def begin_restore(ctx: Context, records: Sequence[Mapping[str, Any]]) -> None:
    """Before the restore of nodes with these journal ``records``: the freeze, when their
    settings ask for one and none is applied yet (restores of one change running side by side
    share it).

    Raises:
        NodeOperationError: the freeze could not be put in force (no node was touched).
    """
    with _lock:
        cls = wanted(records)
        if cls is not None and applied(ctx.journal.entries()) is None:
            timeout = max(float((r.get("settings") or {}).get("timeout_s") or 60) for r in records)
            freeze(ctx, cls, timeout)
        ctx.restores += 1


def end_restore(ctx: Context) -> None:
    """After a restore: the freeze removed once no other restore under ``ctx`` runs."""
    with _lock:
        ctx.restores = max(ctx.restores - 1, 0)
        if ctx.restores:
            return
        state = applied(ctx.journal.entries())
        if state is not None:
            thaw(ctx, state)


def end_change(ctx: Context) -> None:
    """At the change's end, whoever ends it: a freeze the journal shows applied is removed."""
    with _lock:
        if ctx.restores:
            return
        state = applied(ctx.journal.entries())
        if state is not None:
            thaw(ctx, state)
