"""Proof by trying: each tenant identity asks the live API server for what the tenancy file
forbids and for what it allows, impersonated and as a server-side dry run, and each answer is
compared with the expected one.

What a row is: one request (``probe``), one RBAC question (``rbac``: a SubjectAccessReview
for a write tenants must not hold, whatever the policy says), one state check (``namespace``:
a tenant namespace already labelled admin-access) or one policy object (``policy``: the
rendered ValidatingAdmissionPolicy or binding is on the server as rendered). A forbidden
request that gets through names what let it (the RBAC binding the SubjectAccessReview names,
and the policy that should have refused it, with why it did not); an allowed request that is
refused names who refused it (RBAC, a policy and its binding, the API server's validation).

Nothing is written: every probe is ``dryRun=All``; the reads and reviews change nothing.
A row that could not be tried (an API the server does not serve, impersonation refused, no
node in the pool) is ``untested``, and the audit then never passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rollout.change.tenancy.live_checks import ADMISSION_V1, RESOURCE_V1, LiveFacts
from rollout.change.tenancy.policy import (
    ADMIN_ACCESS_LABEL,
    IMPLICIT_PREFIX,
    Identity,
    Tenancy,
    Tenant,
    expected_refuser,
    render,
)
from rollout.errors import truncate
from rollout.kube.tenancy import Answer, TenancyApi

PROBE_NAME = "rollout-tenancy-audit"
OFF_LIST_CLASS = "rollout-tenancy-audit.example.com"
OFF_LIST_SELECTOR = "true"
#: Writes no tenant may hold through RBAC, whatever the policy refuses: (group, resource,
#: verbs). Node labels, DeviceClasses and ResourceSlices belong to administrators and drivers
#: (the design document); the policies themselves too.
RBAC_WRITES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "nodes", ("update", "patch", "delete")),
    ("resource.k8s.io", "deviceclasses", ("create", "update", "patch", "delete")),
    ("resource.k8s.io", "resourceslices", ("create", "update", "patch", "delete")),
    ("resource.k8s.io", "devicetaintrules", ("create", "update", "patch", "delete")),
    (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
        ("create", "update", "patch", "delete"),
    ),
    (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
        ("create", "update", "patch", "delete"),
    ),
)

_VAP = re.compile(r"ValidatingAdmissionPolicy '([^']+)' with binding '([^']+)'")


@dataclass(frozen=True)
class Row:
    """One check: what was tried, what was expected, what the API server answered."""

    kind: str  # probe | rbac | namespace | policy
    tenant: str
    identity: str
    case: str
    expect: str  # refused | allowed | present
    got: str  # refused | allowed | present | missing | differs | untested | n/a
    by: str  # who refused it, or what let it through
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Audit:
    """The rows and the verdict: ``pass`` (every row as expected), ``fail`` (one is not), or
    ``incomplete`` (none failed but one could not be tried: never reported as a pass)."""

    policy: str
    rows: tuple[Row, ...]
    server: Mapping[str, bool]

    @property
    def result(self) -> str:
        if any(not r.ok for r in self.rows):
            return "fail"
        if any(r.got == "untested" for r in self.rows):
            return "incomplete"
        return "pass"

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "result": self.result,
            "server": dict(self.server),
            "failed": sum(1 for r in self.rows if not r.ok),
            "untested": sum(1 for r in self.rows if r.got == "untested"),
            "rows": [asdict(r) for r in self.rows],
        }


def _why(message: str) -> str:
    """The API server's reason, verbatim: for a policy, from its "denied request:" on."""
    cut = message.find("denied request: ")
    return truncate(message[cut + len("denied request: ") :] if cut >= 0 else message)


def refused_by(ans: Answer) -> str:
    """Who refused a request, from the API server's own wording."""
    m = _VAP.search(ans.message)
    if m:
        return f"policy {m.group(1)} (binding {m.group(2)})"
    if ans.status == 403 and " cannot " in ans.message:
        return "RBAC"
    if ans.status == 422:
        return "API server validation"
    return f"HTTP {ans.status}"


# --- request bodies --------------------------------------------------------------------------


def _exact(cls: str, count: int | None, selectors: list[str], **extra: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"deviceClassName": cls}
    if count is None:
        e["allocationMode"] = "All"
    else:
        e.update(allocationMode="ExactCount", count=count)
    if selectors:
        e["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    e.update(extra)
    return {"name": "gpu", "exactly": e}


def _first(alternatives: list[tuple[str, int]], selectors: list[str]) -> dict[str, Any]:
    subs = []
    for i, (cls, count) in enumerate(alternatives):
        s: dict[str, Any] = {"name": f"alt{i}", "deviceClassName": cls, "count": count}
        if selectors:
            s["selectors"] = [{"cel": {"expression": x}} for x in selectors]
        subs.append(s)
    return {"name": "gpu", "firstAvailable": subs}


def _claim(ns: str, request: dict[str, Any], config: list[Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [request]}
    if config:
        devices["config"] = config
    return {
        "apiVersion": RESOURCE_V1,
        "kind": "ResourceClaim",
        "metadata": {"name": PROBE_NAME, "namespace": ns},
        "spec": {"devices": devices},
    }


def _template(ns: str, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_V1,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": PROBE_NAME, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _pod(
    ns: str, runtime_class: str | None, limits: Mapping[str, int] | None = None, claim: bool = False
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    spec: dict[str, Any] = {"containers": [container]}
    if limits:
        container["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": PROBE_NAME}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": PROBE_NAME, "namespace": ns},
        "spec": spec,
    }


# --- the audit ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Probe:
    case: str
    area: str  # claims | pods | namespaces | nodes | dra  (the policy that should refuse)
    expect: str
    method: str
    path: str
    body: dict[str, Any]
    patch: bool = False
    needs: str = ""  # a served group-version the probe needs


def _probes(
    t: Tenancy, tenant: Tenant, ns: str, facts: LiveFacts, node: Any, labelled: bool = False
) -> list[_Probe]:
    """``labelled``: ``ns`` already carries the admin-access label (then the probe tries to
    remove it: setting it again would change nothing, and prove nothing)."""
    cls = tenant.device_classes[0]
    sel = list(tenant.selectors[:1])
    n = tenant.max_count
    rc = tenant.runtime_classes[0]
    off_cls = next((c for c in facts.classes if c not in tenant.device_classes), OFF_LIST_CLASS)
    claims = f"/apis/{RESOURCE_V1}/namespaces/{ns}/resourceclaims"
    templates = f"/apis/{RESOURCE_V1}/namespaces/{ns}/resourceclaimtemplates"
    pods = f"/api/v1/namespaces/{ns}/pods"
    driver = (
        cls
        if re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", cls) and "." in cls
        else "gpu.example.com"
    )
    ext = tenant.extended_resources[0] if tenant.extended_resources else IMPLICIT_PREFIX + cls
    out = [
        # what the tenant may do: a policy that refuses everything fails here
        _Probe(
            "claim allowed class, selector, count",
            "claims",
            "allowed",
            "POST",
            claims,
            _claim(ns, _exact(cls, n, sel)),
            needs=RESOURCE_V1,
        ),
        _Probe(
            "template firstAvailable, all allowed",
            "claims",
            "allowed",
            "POST",
            templates,
            _template(ns, _first([(c, n) for c in tenant.device_classes][:2] or [(cls, n)], sel)),
            needs=RESOURCE_V1,
        ),
        _Probe(
            "pod with a claim and the RuntimeClass",
            "pods",
            "allowed",
            "POST",
            pods,
            _pod(ns, rc, claim=True),
        ),
        _Probe(
            f"pod {ext}: {n if tenant.extended_resources else 1} with the RuntimeClass",
            "pods",
            "allowed",
            "POST",
            pods,
            _pod(ns, rc, {ext: n if tenant.extended_resources else 1}),
        ),
        # what it may not
        _Probe(
            "claim adminAccess",
            "claims",
            "refused",
            "POST",
            claims,
            _claim(ns, _exact(cls, 1, sel, adminAccess=True)),
            needs=RESOURCE_V1,
        ),
        _Probe(
            f"claim class off the list ({off_cls})",
            "claims",
            "refused",
            "POST",
            claims,
            _claim(ns, _exact(off_cls, 1, sel)),
            needs=RESOURCE_V1,
        ),
        _Probe(
            "claim selector off the list",
            "claims",
            "refused",
            "POST",
            claims,
            _claim(ns, _exact(cls, 1, [OFF_LIST_SELECTOR])),
            needs=RESOURCE_V1,
        ),
        _Probe(
            f"claim count {n + 1} over the cap",
            "claims",
            "refused",
            "POST",
            claims,
            _claim(ns, _exact(cls, n + 1, sel)),
            needs=RESOURCE_V1,
        ),
        _Probe(
            "claim allocationMode All",
            "claims",
            "refused",
            "POST",
            claims,
            _claim(ns, _exact(cls, None, sel)),
            needs=RESOURCE_V1,
        ),
        _Probe(
            "claim device taint toleration",
            "claims",
            "refused",
            "POST",
            claims,
            _claim(ns, _exact(cls, 1, sel, tolerations=[{"operator": "Exists"}])),
            needs=RESOURCE_V1,
        ),
        _Probe(
            "claim opaque driver config",
            "claims",
            "refused",
            "POST",
            claims,
            _claim(
                ns,
                _exact(cls, 1, sel),
                config=[{"opaque": {"driver": driver, "parameters": {"sharing": "TimeSlicing"}}}],
            ),
            needs=RESOURCE_V1,
        ),
        _Probe(
            "template firstAvailable with a class off the list",
            "claims",
            "refused",
            "POST",
            templates,
            _template(ns, _first([(cls, 1), (off_cls, 1)], sel)),
            needs=RESOURCE_V1,
        ),
        _Probe(
            f"template count {n + 1} over the cap",
            "claims",
            "refused",
            "POST",
            templates,
            _template(ns, _exact(cls, n + 1, sel)),
            needs=RESOURCE_V1,
        ),
        _Probe(
            "pod with a claim, no RuntimeClass",
            "pods",
            "refused",
            "POST",
            pods,
            _pod(ns, None, claim=True),
        ),
        _Probe(
            f"pod {ext}: 1, no RuntimeClass",
            "pods",
            "refused",
            "POST",
            pods,
            _pod(ns, None, {ext: 1}),
        ),
        _Probe(
            f"pod {ext}: {n + 1} over the cap",
            "pods",
            "refused",
            "POST",
            pods,
            _pod(ns, rc, {ext: n + 1}),
        ),
        _Probe(
            f"pod implicit name of {off_cls}",
            "pods",
            "refused",
            "POST",
            pods,
            _pod(ns, rc, {IMPLICIT_PREFIX + off_cls: 1}),
        ),
        _Probe(
            f"remove namespace {ns}'s admin-access label"
            if labelled
            else f"label namespace {ns} admin-access",
            "namespaces",
            "refused",
            "PATCH",
            f"/api/v1/namespaces/{ns}",
            {"metadata": {"labels": {ADMIN_ACCESS_LABEL: None if labelled else "true"}}},
            patch=True,
        ),
    ]
    keys = list(tenant.namespace_selector.get("matchLabels") or {})
    if keys:
        out.append(
            _Probe(
                f"remove namespace {ns}'s label {keys[0]}",
                "namespaces",
                "refused",
                "PATCH",
                f"/api/v1/namespaces/{ns}",
                {"metadata": {"labels": {keys[0]: None}}},
                patch=True,
            )
        )
    out += [
        _Probe(f"edit DeviceClass {cls}", "dra", "refused", "PATCH",
               f"/apis/{RESOURCE_V1}/deviceclasses/{cls}",
               {"metadata": {"labels": {"rollout.dev/tenancy-audit": "probe"}}}, patch=True,
               needs=RESOURCE_V1),
        _Probe("create a DeviceClass", "dra", "refused", "POST",
               f"/apis/{RESOURCE_V1}/deviceclasses",
               {"apiVersion": RESOURCE_V1, "kind": "DeviceClass",
                "metadata": {"name": PROBE_NAME}, "spec": {}}, needs=RESOURCE_V1),
        _Probe("create a ResourceSlice", "dra", "refused", "POST",
               f"/apis/{RESOURCE_V1}/resourceslices",
               {"apiVersion": RESOURCE_V1, "kind": "ResourceSlice",
                "metadata": {"name": PROBE_NAME},
                "spec": {"driver": driver, "allNodes": True,
                         "pool": {"name": PROBE_NAME, "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": "gpu-0"}]}}, needs=RESOURCE_V1),
    ]  # fmt: skip
    if node is not None:
        name = node["metadata"]["name"]
        path = f"/api/v1/nodes/{name}"
        for key in t.protected_labels[:1]:
            out.append(_Probe(f"change node {name}'s label {key}", "nodes", "refused", "PATCH",
                              path, {"metadata": {"labels": {key: "rollout-tenancy-audit"}}},
                              patch=True))  # fmt: skip
        for key in t.protected_taints[:1]:
            taints = list((node.get("spec") or {}).get("taints") or [])
            kept = [x for x in taints if x.get("key") != key]
            if len(kept) == len(taints):
                kept.append({"key": key, "value": "rollout-tenancy-audit", "effect": "NoSchedule"})
            out.append(_Probe(f"change node {name}'s taint {key}", "nodes", "refused", "PATCH",
                              path, {"spec": {"taints": kept}}, patch=True))  # fmt: skip
    return out


def _policy_state(
    t: Tenancy, kapi: TenancyApi, rendered: list[dict[str, Any]]
) -> dict[str, tuple[str, str]]:
    """Each rendered object's name and kind -> (got, detail): present, missing or differs."""
    out: dict[str, tuple[str, str]] = {}
    for obj in rendered:
        kind, name = obj["kind"], obj["metadata"]["name"]
        plural = (
            "validatingadmissionpolicies"
            if kind == "ValidatingAdmissionPolicy"
            else "validatingadmissionpolicybindings"
        )
        live = kapi.get(f"/apis/{ADMISSION_V1}/{plural}/{name}")
        if live is None:
            out[f"{kind}/{name}"] = ("missing", f"no {kind} {name} on the API server")
            continue
        diff = _differs(obj["spec"], live.get("spec"), "spec")
        if diff:
            out[f"{kind}/{name}"] = ("differs", f"{diff} differs from the rendered one")
            continue
        warnings = ((live.get("status") or {}).get("typeChecking") or {}).get(
            "expressionWarnings"
        ) or []
        if warnings:
            out[f"{kind}/{name}"] = (
                "differs",
                f"type-checking warnings: {truncate(str(warnings))}",
            )
            continue
        out[f"{kind}/{name}"] = ("present", "")
    return out


def _differs(want: Any, got: Any, where: str) -> str:
    """The first path where ``got`` lacks or changes what ``want`` says ("" when none): the
    API server adds defaults, so only the rendered fields are compared."""
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping):
            return where
        for k, v in want.items():
            d = _differs(v, got.get(k), f"{where}.{k}")
            if d:
                return d
        return ""
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return where
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            d = _differs(a, b, f"{where}[{i}]")
            if d:
                return d
        return ""
    return "" if want == got else where


def run_audit(
    t: Tenancy,
    kapi: TenancyApi,
    facts: LiveFacts,
    identities: Mapping[str, tuple[Identity, ...]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Audit:
    """Run every check. ``identities``: per tenant name, who to try as (default: the file's)."""
    say = progress or (lambda _m: None)
    server = {
        RESOURCE_V1: kapi.served(RESOURCE_V1),
        "validatingadmissionpolicies": _serves_vap(kapi),
    }
    rows: list[Row] = []
    rendered = render(t, facts.dra_names)
    states: dict[str, tuple[str, str]] = {}
    if server["validatingadmissionpolicies"]:
        states = _policy_state(t, kapi, rendered)
        for key, (got, detail) in states.items():
            rows.append(Row("policy", "", "", key, "present", got, "", got == "present", detail))
    else:
        rows.append(
            Row(
                "policy",
                "",
                "",
                "ValidatingAdmissionPolicy",
                "present",
                "untested",
                "",
                True,
                f"the API server does not serve {ADMISSION_V1} validatingadmissionpolicies: "
                "the rendered policy cannot be in force",
            )
        )
    node = _pool_node(t, kapi)
    labelled = {
        n["metadata"]["name"] for n in kapi.list("/api/v1/namespaces", f"{ADMIN_ACCESS_LABEL}=true")
    }
    for tenant in t.tenants:
        namespaces = facts.namespaces.get(tenant.name) or ()
        for name in sorted(labelled):
            if name in namespaces:
                rows.append(
                    Row(
                        "namespace",
                        tenant.name,
                        "",
                        f"namespace {name} labelled admin-access",
                        "absent",
                        "present",
                        f"label {ADMIN_ACCESS_LABEL}=true",
                        False,
                        "claims in it may ask for adminAccess past the API server's own check;"
                        " only the policy stands in the way",
                    )
                )
        who = (identities or {}).get(tenant.name, tenant.identities)
        if not who:
            rows.append(Row("probe", tenant.name, "", "identities", "some", "untested", "", True,
                            "no identity to try as: the file's or --user"))  # fmt: skip
            continue
        if not namespaces:
            rows.append(Row("probe", tenant.name, "", "namespaces", "some", "untested", "", True,
                            "no namespace matches the tenant's selector"))  # fmt: skip
            continue
        ns = namespaces[0]
        for ident in who:
            say(f"tenant {tenant.name}: trying as {ident.name} in namespace {ns}")
            rows += _as_identity(
                t, tenant, ident, ns, kapi, facts, node, server, states, ns in labelled
            )
        if node is None:
            rows.append(Row("probe", tenant.name, "", "pool node", "some", "untested", "", True,
                            "no node matches pool.nodeSelector: the node label and taint "
                            "probes were not tried"))  # fmt: skip
    return Audit(t.name, tuple(rows), server)


def _serves_vap(kapi: TenancyApi) -> bool:
    listing = kapi.get(f"/apis/{ADMISSION_V1}")
    names = {r.get("name") for r in (listing or {}).get("resources") or ()}
    return "validatingadmissionpolicies" in names


def _pool_node(t: Tenancy, kapi: TenancyApi) -> Any:
    if not t.node_selector:
        return None
    sel = ",".join(f"{k}={v}" for k, v in t.node_selector.items())
    nodes = sorted(kapi.list("/api/v1/nodes", sel), key=lambda n: n["metadata"]["name"])
    return nodes[0] if nodes else None


def _as_identity(
    t: Tenancy,
    tenant: Tenant,
    ident: Identity,
    ns: str,
    kapi: TenancyApi,
    facts: LiveFacts,
    node: Any,
    server: Mapping[str, bool],
    states: Mapping[str, tuple[str, str]],
    labelled: bool,
) -> list[Row]:
    rows: list[Row] = []

    def row(
        kind: str, case: str, expect: str, got: str, by: str, ok: bool, detail: str = ""
    ) -> None:
        rows.append(Row(kind, tenant.name, ident.name, case, expect, got, by, ok, detail))

    try:
        seen = kapi.who_am_i(ident.user, ident.groups)
    except Exception as e:  # impersonation refused: nothing as this identity can be trusted
        row("probe", "impersonate", "allowed", "untested", "", True,
            f"cannot impersonate {ident.user}: {truncate(str(e))}")  # fmt: skip
        return rows
    if seen.get("username") != ident.user:
        row("probe", "impersonate", "allowed", "untested", "", True,
            f"the API server saw {seen.get('username')!r}, not {ident.user!r}")  # fmt: skip
        return rows
    groups = tuple(seen.get("groups") or ident.groups)
    for p in _probes(t, tenant, ns, facts, node, labelled):
        if p.needs and not server.get(p.needs):
            row("probe", p.case, p.expect, "untested", "", True,
                f"the API server does not serve {p.needs}")  # fmt: skip
            continue
        ans = kapi.as_tenant(ident.user, ident.groups, p.method, p.path, p.body, patch=p.patch)
        if "cannot impersonate" in ans.message:
            row("probe", p.case, p.expect, "untested", "", True, truncate(ans.message))
            continue
        if ans.status == 404:
            row("probe", p.case, p.expect, "untested", "", True,
                f"the object is not there: {truncate(ans.message)}")  # fmt: skip
            continue
        got = "allowed" if ans.allowed else "refused"
        if got == "refused":
            row("probe", p.case, p.expect, got, refused_by(ans), p.expect == "refused",
                _why(ans.message))  # fmt: skip
            continue
        if p.expect == "allowed":
            row("probe", p.case, p.expect, got, "", True)
            continue
        rows.append(_let_through(t, tenant, ident, groups, p, ns, kapi, states))
    for group, resource, verbs in RBAC_WRITES:
        allowed = []
        for verb in verbs:
            ok, reason = kapi.access_review(ident.user, groups, verb, group, resource)
            if ok:
                allowed.append((verb, reason))
        if allowed:
            row("rbac", f"may {'/'.join(v for v, _ in allowed)} {resource}", "refused", "allowed",
                allowed[0][1] or "the authorizer (no reason given)", False,
                "only administrators and drivers may write these; RBAC grants it")  # fmt: skip
        else:
            row("rbac", f"may write {resource}", "refused", "refused", "RBAC", True)
    return rows


def _let_through(
    t: Tenancy,
    tenant: Tenant,
    ident: Identity,
    groups: tuple[str, ...],
    p: _Probe,
    ns: str,
    kapi: TenancyApi,
    states: Mapping[str, tuple[str, str]],
) -> Row:
    """A forbidden request the API server accepted: what let it (the RBAC binding, named by a
    SubjectAccessReview) and why the policy that should have refused it did not."""
    resource, namespace = _attrs(p.path)
    verb = "patch" if p.method == "PATCH" else "create"
    group = p.path.split("/")[2] if p.path.startswith("/apis/") else ""
    _, reason = kapi.access_review(ident.user, groups, verb, group, resource, namespace)
    policy = expected_refuser(t, tenant, p.area)
    why = ""
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        got, detail = states.get(f"{kind}/{policy}", ("untested", ""))
        if got != "present":
            why = detail or f"{kind} {policy}: admission policies are not served"
            break
    if not why:
        why = (
            f"policy {policy} and its binding are in place as rendered; namespace {ns} may not "
            "match its namespaceSelector, or the request's identity is exempt"
        )
    return Row(
        "probe", tenant.name, ident.name, p.case, p.expect, "allowed",
        f"{reason or 'the authorizer'}; expected refuser {policy}", False, why,
    )  # fmt: skip


def _attrs(path: str) -> tuple[str, str]:
    """(resource, namespace) of an API path."""
    parts = path.strip("/").split("/")
    ns = ""
    if "namespaces" in parts:
        i = parts.index("namespaces")
        if i + 2 < len(parts):
            ns = parts[i + 1]
            return parts[i + 2], ns
        return "namespaces", ""
    base = 2 if parts[0] == "api" else 3
    return parts[base], ns


#: Topology Manager policies that align devices with CPUs: a change leaving one on a shared pool
#: tightens what tenants' pods may be admitted with.
ALIGNING = ("restricted", "single-numa-node")


def change_refusals(audit: Audit, limit: int = 10) -> list[str]:
    """A failed or incomplete audit as preflight refusal lines: the verdict, then the rows that
    are not as expected (or could not be tried), at most ``limit`` of them."""
    bad = [r for r in audit.rows if not r.ok or r.got == "untested"]
    out = [
        f"tenancy audit of {audit.policy}: {audit.result} ({len(audit.rows)} checks, "
        f"{sum(1 for r in audit.rows if not r.ok)} failed, "
        f"{sum(1 for r in audit.rows if r.got == 'untested')} not tried; "
        "`rollout tenancy audit` shows them all)"
    ]
    for r in bad[:limit]:
        who = " ".join(x for x in (r.tenant, r.identity) if x)
        out.append(
            f"tenancy audit: {who + ': ' if who else ''}{r.case}: expected {r.expect}, "
            f"got {r.got}{f' ({r.by})' if r.by else ''}"
        )
    return out


def audit_plan_tenancy(path: str, api: Any) -> Audit:
    """The audit of a plan's tenancy file (``tenancy:``), as ``rollout tenancy audit`` runs it
    with the file's identities.

    Raises:
        InputError: the file is malformed or names what the cluster lacks.
    """
    from rollout.change.tenancy.live_checks import read_facts
    from rollout.change.tenancy.policy import load

    t = load(path)
    kapi = TenancyApi(api)
    return run_audit(t, kapi, read_facts(t, kapi, require_dra=False))
