"""The typed record: one frozen type per journal entry's payload, read and written here only.

Why: a journal entry's ``data`` is a JSON object. Read by string key in a dozen modules
(``info.get("canary")``), a misspelt key was a silent ``None`` and a renamed one broke old
journals without a test noticing. Here each payload has one type whose :meth:`read` is the only
place its keys are spelt when read and whose ``data()`` the only place they are spelt when
written; the rest of rollout passes the types (``tests/unit/test_entries.py``).

Versions: :data:`SCHEMA_VERSION` is written as ``v`` in every entry
(:meth:`rollout.change.record.journal.Entry.to_json`); an entry of a newer version is refused by
name, never guessed at (a rollback must not act on a record it cannot read). Within one version the
payloads only grow: a key this version does not know is ignored on read (a field a newer
writer added without changing what the known ones mean; a change of meaning is a new version,
refused), and the change's ``begin`` (:class:`ChangeBegin`) carries such keys through
(``extra``) when a later part of the change journals it again. Keys missing from an older
writer's entry read as the field's default. Journals written by this version and by the
versions before it read alike (``tests/unit/test_entries.py::test_journals_written_before_read``,
fixtures in ``tests/unit/data/journals/``).

A kind of change's own step payloads (``rollout.change.engine.context.KindSteps``: what its
baseline, release and label steps record) belong to that kind's module; the engine's are here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.models import FileBackup

SCHEMA_VERSION = 1
"""The journal's schema version, written as ``v`` in every entry (entries without one are v1).
An entry of a newer version is refused by name, never guessed at: a rollback must not act on a
record it cannot read (``tests/unit/test_journal.py::test_an_entry_of_a_newer_schema_is_refused``).
"""

Json = dict[str, Any]


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value or ())


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _some(**fields: Any) -> Json:
    """The fields that are not None (a payload leaves out what it does not record)."""
    return {k: v for k, v in fields.items() if v is not None}


# --- the change's begin and end --------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """A staged plan's stage, as its change records it (``rollout.change.commands.stages``)."""

    plan: str
    index: int | None  # None: not recorded (the plan then runs as is)
    name: str
    count: int

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> Stage:
        index = data.get("index")
        return cls(
            plan=str(data.get("plan", "")),
            index=index if isinstance(index, int) else None,
            name=str(data.get("name", "")),
            count=int(data.get("count", 0)),
        )

    def data(self) -> Json:
        return {"plan": self.plan, "index": self.index, "name": self.name, "count": self.count}


@dataclass(frozen=True)
class Promotion:
    """What ``rollout promote`` recorded: who, when, the batches it runs and what was forced."""

    by: str
    at: str
    batches: tuple[tuple[str, ...], ...]
    forced: str | None = None
    refusal: str | None = None
    # what preflight's device and serving refusals let through (None: a kind of change
    # without them, the allocation-path migration, records none of the three)
    forced_refusals: tuple[str, ...] | None = None
    forced_serving: str | None = None
    forced_serving_canaries: tuple[str, ...] = ()
    # the allocation-path migration's ``promote --terminate-claims`` (None: another kind)
    terminate_claims: bool | None = None

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> Promotion:
        refusals = data.get("forcedRefusals")
        consent = data.get("terminateClaims")
        return cls(
            by=str(data.get("by", "")),
            at=str(data.get("at", "")),
            batches=tuple(_strs(b) for b in data.get("batches") or ()),
            forced=_opt_str(data.get("forced")),
            refusal=_opt_str(data.get("refusal")),
            forced_refusals=None if refusals is None else _strs(refusals),
            forced_serving=_opt_str(data.get("forcedServing")),
            forced_serving_canaries=_strs(data.get("forcedServingCanaries")),
            terminate_claims=None if consent is None else bool(consent),
        )

    def data(self) -> Json:
        out: Json = {
            "by": self.by,
            "at": self.at,
            "batches": [list(b) for b in self.batches],
            "forced": self.forced,
            "refusal": self.refusal,
        }
        if self.forced_refusals is not None:
            out["forcedRefusals"] = list(self.forced_refusals)
            out["forcedServing"] = self.forced_serving
            out["forcedServingCanaries"] = list(self.forced_serving_canaries)
        if self.terminate_claims is not None:
            out["terminateClaims"] = self.terminate_claims
        return out


@dataclass(frozen=True)
class RollbackAsked:
    """A rollback's ``begin``: the nodes it restores (None: every node) and ``--force``."""

    nodes: tuple[str, ...] | None = None
    force: bool = False

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> RollbackAsked:
        nodes = data.get("nodes")
        return cls(tuple(str(n) for n in nodes) if nodes else None, bool(data.get("force")))

    def data(self) -> Json:
        return {"nodes": list(self.nodes) if self.nodes else None, "force": self.force}


_BEGIN_KEYS = frozenset(
    [
        "nodes",
        "batches",
        "canary",
        "canaryOnly",
        "terminateClaims",
        "window",
        "plan",
        "planText",
        "inventory",
        "intentSha256",
        "by",
        "stage",
        "promotion",
        "rollback",
        "kind",
        "resumed",
    ]
)


@dataclass(frozen=True)
class ChangeBegin:
    """A change-level ``begin`` (the change's info): what this part of the change runs.

    Attributes:
        nodes: every node of the change, in order (pending ones included).
        batches: every batch of the change so far (a promotion appends its own).
        canary: the canary batches' nodes.
        canary_only: ``apply --canary``: hold after the canary.
        window: the change window's decision before the first batch (``windows.Decision``'s
            document), when the plan has windows.
        plan, plan_text, inventory: the plan's path and text and the inventory's path, so a
            machine without the files resumes and rolls back (``plan.recorded_plan``).
        intent_sha256: the digest of the kubelet intent (``session.intent_digest``).
        by: who ran it.
        stage: a staged plan's stage.
        promotion: what ``promote`` recorded, for a promoted part.
        rollback: what ``rollback`` asked, for a rollback's begin.
        kind: the kind of change, when not the kubelet-config change (``kinds.recorded_kind``).
        resumed: this part is a ``resume``.
        terminate_claims: the allocation-path migration's consent to terminate the pods holding
            claims on the way back (``migrate``/``promote --terminate-claims``; None: another
            kind, which records none).
        extra: keys this version does not know, carried through when the begin is journaled again.
    """

    nodes: tuple[str, ...] = ()
    batches: tuple[tuple[str, ...], ...] = ()
    canary: tuple[str, ...] = ()
    canary_only: bool = False
    window: Mapping[str, Any] | None = None
    plan: str | None = None
    plan_text: str | None = None
    inventory: str | None = None
    intent_sha256: str | None = None
    by: str | None = None
    stage: Stage | None = None
    promotion: Promotion | None = None
    rollback: RollbackAsked | None = None
    kind: str | None = None
    resumed: bool = False
    terminate_claims: bool | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> ChangeBegin:
        stage, promotion, rollback = data.get("stage"), data.get("promotion"), data.get("rollback")
        window = data.get("window")
        return cls(
            nodes=_strs(data.get("nodes")),
            batches=tuple(_strs(b) for b in data.get("batches") or ()),
            canary=_strs(data.get("canary")),
            canary_only=bool(data.get("canaryOnly")),
            window=dict(window) if isinstance(window, Mapping) else None,
            plan=_opt_str(data.get("plan")),
            plan_text=_opt_str(data.get("planText")),
            inventory=_opt_str(data.get("inventory")),
            intent_sha256=_opt_str(data.get("intentSha256")),
            by=_opt_str(data.get("by")),
            stage=Stage.read(stage) if stage and isinstance(stage, Mapping) else None,
            promotion=(
                Promotion.read(promotion) if promotion and isinstance(promotion, Mapping) else None
            ),
            rollback=(
                RollbackAsked.read(rollback) if rollback and isinstance(rollback, Mapping) else None
            ),
            kind=_opt_str(data.get("kind")),
            resumed=bool(data.get("resumed")),
            terminate_claims=(
                None if data.get("terminateClaims") is None else bool(data["terminateClaims"])
            ),
            extra={k: v for k, v in data.items() if k not in _BEGIN_KEYS},
        )

    def data(self) -> Json:
        return {
            **self.extra,
            "nodes": list(self.nodes),
            "batches": [list(b) for b in self.batches],
            "canary": list(self.canary),
            "canaryOnly": self.canary_only,
            **_some(
                window=dict(self.window) if self.window is not None else None,
                plan=self.plan,
                planText=self.plan_text,
                inventory=self.inventory,
                intentSha256=self.intent_sha256,
                by=self.by,
                stage=self.stage.data() if self.stage else None,
                promotion=self.promotion.data() if self.promotion else None,
                rollback=self.rollback.data() if self.rollback else None,
                kind=self.kind,
                resumed=True if self.resumed else None,
                terminateClaims=self.terminate_claims,
            ),
        }

    def path_of(self, key: str) -> str | None:
        """The recorded path of the ``plan`` or the ``inventory`` (``session.info_path``)."""
        return {"plan": self.plan, "inventory": self.inventory}[key]


@dataclass(frozen=True)
class ChangeEnd:
    """A change-level ``done`` / ``failed``: the outcome, message and cause, as recorded (the
    values of ``rollout.change.record.change_outcomes``' enums; None: not recorded)."""

    outcome: str | None = None
    message: str = ""
    cause: str | None = None

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> ChangeEnd:
        outcome, cause = data.get("outcome"), data.get("cause")
        return cls(
            outcome=None if outcome is None else str(outcome),
            message=str(data.get("message", "")),
            cause=None if cause is None else str(cause),
        )

    def data(self) -> Json:
        return {"outcome": self.outcome, "message": self.message, **_some(cause=self.cause)}


# --- the gate ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateRecord:
    """A ``gate`` entry: the soak over ``nodes`` began, or (done) its verdict."""

    nodes: tuple[str, ...] = ()
    status: str = ""
    reason: str = ""

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> GateRecord:
        return cls(
            _strs(data.get("nodes")), str(data.get("status") or ""), str(data.get("reason") or "")
        )

    def data(self) -> Json:
        """The ``begin`` (nodes only) or, with a status, the ``done``."""
        if not self.status:
            return {"nodes": list(self.nodes)}
        return {"status": self.status, "reason": self.reason, "nodes": list(self.nodes)}


@dataclass(frozen=True)
class VerdictRecord:
    """A ``verdict`` entry: one gate evaluation (``rollout.gate``'s ``Verdict.as_dict`` over
    ``nodes``); ``inputs`` is the gate's own document of what it read."""

    status: str
    reason: str
    nodes: tuple[str, ...]
    inputs: Mapping[str, Any]

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> VerdictRecord:
        return cls(
            status=str(data.get("outcome", data.get("status", ""))),
            reason=str(data.get("reason", "")),
            nodes=_strs(data.get("nodes")),
            inputs=_obj(data.get("inputs")),
        )

    @property
    def threshold(self) -> float | None:
        """The gate's rejection-rate threshold the inputs name, if any."""
        t = _obj(self.inputs.get("config")).get("threshold")
        return None if t is None else float(t)

    def signals(self) -> list[tuple[str, int, int]]:
        """Each signal's name, admissions and rejections over its nodes."""
        out = []
        for name, sig in _obj(self.inputs.get("signals")).items():
            nodes = _obj(_obj(sig).get("nodes"))
            adm = sum(int(_obj(n).get("admissions", 0)) for n in nodes.values())
            rej = sum(
                sum(int(v) for v in _obj(_obj(n).get("rejections")).values())
                for n in nodes.values()
            )
            out.append((str(name), adm, rej))
        return out


@dataclass(frozen=True)
class TriggerRecord:
    """A ``trigger`` entry: what asked for a rollback (``trigger``: gate, alert, watch) and
    which nodes; or, with ``outcome``, how the rollback the trigger ``id`` started ended."""

    trigger: str | None = None
    nodes: tuple[str, ...] | None = None
    reason: str | None = None
    id: str | None = None
    alert: str | None = None
    fingerprint: str | None = None
    outcome: str | None = None
    detail: str = ""
    ends: bool = False  # this entry says how an earlier trigger's rollback ended

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> TriggerRecord:
        nodes = data.get("nodes")
        return cls(
            trigger=_opt_str(data.get("trigger")),
            nodes=None if nodes is None else _strs(nodes),
            reason=_opt_str(data.get("reason")),
            id=_opt_str(data.get("id")) or None,
            alert=_opt_str(data.get("alert")),
            fingerprint=_opt_str(data.get("fingerprint")),
            outcome=_opt_str(data.get("outcome")),
            detail=str(data.get("detail") or ""),
            ends="outcome" in data,
        )

    def started(self) -> Json:
        """What ``status`` shows of a new trigger (keys with a value only, then ``nodes``)."""
        shown = _some(id=self.id, alert=self.alert, fingerprint=self.fingerprint)
        if self.reason is not None:
            shown["reason"] = self.reason
        nodes = None if self.nodes is None else list(self.nodes)
        return {**shown, "nodes": nodes}


def trigger_data(
    change: str | None,
    trigger: str,
    nodes: Iterable[str] | None,
    reason: str,
    *,
    source: str | None = None,
    policy: str | None = None,
) -> Json:
    """A new ``trigger`` entry's payload: what asked (``gate``, with the gate's onFailure
    ``policy``; ``source`` ``evidence`` when the canary's evidence failed it), for which nodes
    and why (``change`` None: ``rollout watch``'s, which names the change by its journal)."""
    return {
        **_some(change=change, source=source, policy=policy),
        "trigger": trigger,
        "nodes": None if nodes is None else list(nodes),
        "reason": reason,
    }


def alert_trigger_data(
    change: str,
    id: str,
    alert: str,
    fingerprint: str,
    node: str | None,
    nodes: Iterable[str] | None,
    labels: Mapping[str, str],
    starts_at: Any,
    owner_live: bool | None,
    reason: str,
) -> Json:
    """A ``trigger`` entry for an alert ``rollout serve`` received (``id``: the trigger's)."""
    return {
        "change": change,
        "trigger": "alert",
        "id": id,
        "alert": alert,
        "fingerprint": fingerprint,
        "node": node,
        "nodes": list(nodes) if nodes else None,
        "labels": dict(labels),
        "startsAt": starts_at,
        "ownerLive": owner_live,
        "reason": reason,
    }


def trigger_ended_data(change: str, id: str, outcome: str, detail: str, seconds: float) -> Json:
    """The ``trigger`` entry that says how the rollback trigger ``id`` started ended."""
    return {
        "change": change,
        "trigger": "alert",
        "id": id,
        "outcome": outcome,
        "detail": detail,
        "seconds": seconds,
    }


def verdict_data(change: str, nodes: Iterable[str], verdict: Mapping[str, Any]) -> Json:
    """A ``verdict`` entry: one gate evaluation over ``nodes`` (``verdict``: the gate's
    ``Verdict.as_dict``: outcome, reason, inputs)."""
    return {"change": change, "nodes": list(nodes), **verdict}


def recovery_data(
    change: str, running: Iterable[str], not_running: Iterable[str], waited: float
) -> Json:
    """A ``recovery`` entry (:class:`Recovery`)."""
    return {
        "change": change,
        "running": list(running),
        "notRunning": list(not_running),
        "waited": waited,
    }


@dataclass(frozen=True)
class Recovery:
    """A ``recovery`` entry: after an automatic rollback, which rejected owners run again."""

    running: tuple[str, ...] = ()
    not_running: tuple[str, ...] = ()
    waited: float = 0.0

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> Recovery:
        return cls(
            _strs(data.get("running")), _strs(data.get("notRunning")), float(data.get("waited", 0))
        )


@dataclass(frozen=True)
class RequestRecord:
    """A ``request`` entry: a rollback handed to the change's owner (the Lease holder)."""

    by: str
    nodes: tuple[str, ...] | None = None
    request: str | None = None
    seen_at: Any = None
    force: bool = False

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> RequestRecord:
        nodes = data.get("nodes")
        return cls(
            by=str(data.get("by", "")),
            nodes=_strs(nodes) if nodes else None,
            request=_opt_str(data.get("request")),
            seen_at=data.get("seenAt"),
            force=bool(data.get("force")),
        )

    def data(self) -> Json:
        return {
            "by": self.by,
            "nodes": list(self.nodes) if self.nodes else None,
            "request": self.request,
            "seenAt": self.seen_at,
            **({"force": True} if self.force else {}),
        }


@dataclass(frozen=True)
class Outcome:
    """One verdict of a ``bench-verdict``: its outcome and reason."""

    outcome: str | None = None
    reason: str | None = None

    @classmethod
    def read(cls, data: Any) -> Outcome:
        d = _obj(data)
        return cls(_opt_str(d.get("outcome")), _opt_str(d.get("reason")))

    def data(self) -> Json:
        return {"outcome": self.outcome, "reason": self.reason}


@dataclass(frozen=True)
class BenchVerdict:
    """A ``bench-verdict`` entry (``gate.bench`` on the canary,
    ``rollout.gate.performance.decision_record``): the regression and aligned-advantage
    verdicts, and whether the next stage may tighten."""

    regression: Outcome = field(default_factory=Outcome)
    tightening: Outcome = field(default_factory=Outcome)
    allows_tightening: bool = False

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> BenchVerdict:
        return cls(
            Outcome.read(data.get("regression")),
            Outcome.read(data.get("tightening")),
            bool(data.get("allowsTightening")),
        )

    def summary(self) -> Json:
        """What ``status`` shows: each verdict's outcome and reason."""
        return {
            "allowsTightening": self.allows_tightening,
            "regression": self.regression.data(),
            "tightening": self.tightening.data(),
        }


@dataclass(frozen=True)
class BenchRun:
    """A ``bench`` entry: ``rollout bench`` on ``node`` (``label``: before / after the change);
    ``record`` is the whole entry, ``rollout.bench.results.build_result``'s document or the
    error, as the report shows it."""

    node: str
    label: str
    record: Mapping[str, Any]

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> BenchRun:
        return cls(str(data.get("node", "")), str(data.get("label") or ""), dict(data))


# --- evidence, overrides and consent ------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    """One evidence check's result (``rollout.evidence.checks``' ``as_dict``)."""

    name: str | None
    status: str | None
    summary: str | None
    problems: tuple[str, ...] = ()

    @classmethod
    def read(cls, data: Any) -> CheckResult:
        d = _obj(data)
        return cls(
            _opt_str(d.get("name")),
            _opt_str(d.get("status")),
            _opt_str(d.get("summary")),
            _strs(d.get("problems")),
        )

    def shown(self) -> Json:
        return {"name": self.name, "status": self.status, "summary": self.summary}


@dataclass(frozen=True)
class TenancyAudit:
    """An evidence collection's tenancy audit, as the journal keeps it: verdict and counts."""

    file: str | None = None
    policy: str | None = None
    result: str | None = None
    failed: int = 0
    error: str | None = None
    checks: int | None = None

    @classmethod
    def read(cls, data: Any) -> TenancyAudit:
        d = _obj(data)
        checks = d.get("checks")
        return cls(
            file=_opt_str(d.get("file")),
            policy=_opt_str(d.get("policy")),
            result=_opt_str(d.get("result")),
            failed=int(d.get("failed", 0) or 0),
            error=_opt_str(d.get("error")) or None,
            checks=None if checks is None else int(checks),
        )


def tenancy_data(audit: Mapping[str, Any]) -> Json:
    """The journal's account of a collection's tenancy audit (the collection's ``tenancy``
    document): verdict and counts, no rows."""
    keys = ("file", "policy", "result", "failed", "untested", "error")
    return {**{k: audit[k] for k in keys if k in audit}, "checks": len(audit.get("rows") or ())}


@dataclass(frozen=True)
class EvidenceRecord:
    """An ``evidence`` entry: one collection's label, nodes, file and each check's result, or
    the error that stopped it."""

    label: str
    nodes: tuple[str, ...] = ()
    file: str | None = None
    overall: str | None = None
    checks: tuple[CheckResult, ...] = ()
    error: str | None = None
    tenancy: TenancyAudit | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> EvidenceRecord:
        tenancy = data.get("tenancy")
        return cls(
            label=str(data.get("label", "")),
            nodes=_strs(data.get("nodes")),
            file=_opt_str(data.get("file")),
            overall=_opt_str(data.get("overall")),
            checks=tuple(CheckResult.read(c) for c in data.get("checks") or ()),
            error=_opt_str(data.get("error")) or None,
            tenancy=TenancyAudit.read(tenancy) if tenancy else None,
            raw=data,
        )

    def summary(self) -> Json:
        """What ``status`` shows of it: ``overall``, ``nodes``, ``file``, ``error`` (those
        recorded) and each check's name, status and summary."""
        out = {k: self.raw[k] for k in ("overall", "nodes", "file", "error") if k in self.raw}
        out["checks"] = [c.shown() for c in self.checks]
        return out


def evidence_data(
    label: str,
    nodes: Iterable[str],
    file: str,
    overall: str,
    checks: list[Json] | None = None,
    error: str | None = None,
    tenancy: Mapping[str, Any] | None = None,
) -> Json:
    """An ``evidence`` entry's payload (``rollout.evidence.collecting.journal_evidence``;
    ``tenancy``: the collection's tenancy audit, kept as :func:`tenancy_data`)."""
    data: Json = {"label": label, "nodes": sorted(nodes), "file": file}
    if error is not None:
        data["error"] = error
    data["overall"] = overall
    if checks is not None:
        data["checks"] = checks
    if tenancy:
        data["tenancy"] = tenancy_data(tenancy)
    return data


@dataclass(frozen=True)
class Recreation:
    """A ``recreate`` entry (``apply --recreate-workloads``): one controller's pods on a node
    evicted (begin), then their replacements and the nodes they run on (done: ``placed``, and
    those off the changed nodes) or why not (failed: ``error``)."""

    node: str
    owner: str
    pods: tuple[str, ...]

    def begun(self) -> Json:
        return {"node": self.node, "owner": self.owner, "pods": list(self.pods)}

    def failed(self, error: str) -> Json:
        return {**self.begun(), "error": error}

    def done(self, placed: Mapping[str, str], off_changed_nodes: Iterable[str]) -> Json:
        return {
            **self.begun(),
            "replacements": dict(placed),
            "offChangedNodes": list(off_changed_nodes),
        }


@dataclass(frozen=True)
class DrainOverridesUsed:
    """A ``drain-overrides`` entry: the drain flags given and the pods they may lose."""

    flags: tuple[str, ...]
    pods: tuple[str, ...] = ()

    @classmethod
    def read(cls, data: Mapping[str, Any]) -> DrainOverridesUsed:
        return cls(_strs(data.get("flags")), _strs(data.get("pods")))

    def data(self) -> Json:
        return {"flags": list(self.flags), "pods": list(self.pods)}


@dataclass(frozen=True)
class PreflightForced:
    """A ``preflight-forced`` entry: device refusals overridden with ``--force REASON``."""

    reason: str | None
    refusals: tuple[str, ...]

    def data(self) -> Json:
        return {"reason": self.reason, "refusals": list(self.refusals)}


@dataclass(frozen=True)
class ServingForced:
    """A ``serving-canary-forced`` entry: serving canaries overridden with ``--force-serving``."""

    reason: str | None
    in_progress: tuple[str, ...]

    def data(self) -> Json:
        return {"reason": self.reason, "inProgress": list(self.in_progress)}


@dataclass(frozen=True)
class RejectionsAccepted:
    """A ``predicted-rejections-accepted`` entry: the predictions the operator accepted."""

    rejections: tuple[Any, ...]

    def data(self) -> Json:
        return {"rejections": list(self.rejections)}


# --- node steps ---------------------------------------------------------------------------------


def cordon_begin(prior_cordoned: bool) -> Json:
    """``cordon`` begin: whether the node was cordoned before we touched it."""
    return {"priorCordoned": prior_cordoned}


def cordon_done(cordoned_by_us: bool) -> Json:
    """``cordon`` done: whether this change cordoned it (so only then is it uncordoned)."""
    return {"cordonedByUs": cordoned_by_us}


def uncordon_begin(we_cordoned: bool) -> Json:
    return {"weCordoned": we_cordoned}


def uncordon_done(uncordoned: bool) -> Json:
    return {"uncordoned": uncordoned}


def drain_done(evicted: Iterable[str]) -> Json:
    """``drain`` done: the pods evicted (``namespace/name``)."""
    return {"evicted": list(evicted)}


def step_failed(message: str) -> Json:
    """Any step's ``failed``: why."""
    return {"message": message}


def write_refused(message: str) -> Json:
    """A write step's ``failed`` when compare-and-swap refused it: nothing was written."""
    return {"message": message, "filesWritten": False}


def backup_done(files: Iterable[FileBackup], record: Mapping[str, Any]) -> Json:
    """``backup`` done: the original files (hashes in the backup store) and the kind's record
    of what it writes (``NodeStep.backups``, ``NodeStep.record``)."""
    return {"files": [vars(b) for b in files], "change": dict(record)}


def record_of(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The kind's record a node step's payload carries (``change``: the ``backup`` done of the
    kubelet-config change, another kind's forward ``done``), or None."""
    record = data.get("change")
    return None if record is None else dict(record)


class NodeStep:
    """What the engine reads of a node step's payload (every key optional; which ones a step
    records is the step's: ``cordon`` begin ``priorCordoned``, done ``cordonedByUs``;
    ``uncordon`` done ``uncordoned``; ``drain`` done ``evicted``; ``backup`` done ``files`` and
    ``change``; a write step's ``failed`` ``filesWritten`` false when compare-and-swap refused;
    any ``failed`` its ``message``; a kind's forward ``done`` its ``change`` record; the
    kubelet-config change's ``preflight`` done ``configz``, ``allocatable`` and ``slices``).

    A plain slotted class, not a dataclass: replay reads one per node entry (70,000 for a
    5,000-node change; ``benchmarks/scale_bench.py journal``)."""

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw

    @property
    def prior_cordoned(self) -> bool:
        return bool(self.raw.get("priorCordoned", False))

    @property
    def cordoned_by_us(self) -> bool:
        return bool(self.raw.get("cordonedByUs"))

    @property
    def uncordoned(self) -> bool:
        return bool(self.raw.get("uncordoned"))

    @property
    def evicted(self) -> tuple[str, ...]:
        return _strs(self.raw.get("evicted"))

    @property
    def message(self) -> str:
        return str(self.raw.get("message", ""))

    @property
    def nothing_written(self) -> bool:
        """A write step's compare-and-swap refused: nothing was written."""
        return self.raw.get("filesWritten") is False

    @property
    def backups(self) -> tuple[FileBackup, ...]:
        return tuple(FileBackup(**b) for b in self.raw.get("files", ()))

    @property
    def record(self) -> dict[str, Any]:
        """What the change writes on the node (``KindSteps``' record), as journaled."""
        return dict(self.raw.get("change", {}))

    @property
    def configz(self) -> dict[str, Any]:
        return dict(self.raw.get("configz", {}))

    @property
    def allocatable(self) -> dict[str, str]:
        return dict(self.raw.get("allocatable", {}))

    @property
    def slices(self) -> dict[str, dict[str, int]]:
        return {str(k): dict(v) for k, v in (self.raw.get("slices") or {}).items()}
