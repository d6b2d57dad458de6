"""The tenancy file: who the tenants of a GPU pool are and what each may ask for, and the
ValidatingAdmissionPolicies rendered from it.

Why its own file (``kind: TenancyPolicy``) and not a section of the change plan: the policy is
cluster state that outlives any one change, is applied by GitOps next to the RBAC it completes,
and is audited on its own (``rollout tenancy audit``); a change plan is one node change.

Why the selectors are verbatim strings: a tenant's CEL selector is arbitrary code run by the
scheduler over every device; the policy compares each selector in a claim with the platform's
list as a string, so a tenant can only pick among expressions the platform wrote
(``docs/tenancy.md``).

Nothing here talks to the API server: :func:`load` parses and checks the file's shape,
:func:`render` builds the objects; the live checks (classes exist, selectors compile, selectors
match namespaces) are :mod:`rollout.change.tenancy.live_checks`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.errors import InputError, Location, read_input, suggest
from rollout.kubelet.documents import parse_document

API_VERSION = "rollout.dev/v1alpha1"
KIND = "TenancyPolicy"
TOP_LEVEL = ("apiVersion", "kind", "metadata", "admins", "drivers", "pool", "tenants")
TENANT_KEYS = (
    "name",
    "namespaceSelector",
    "deviceClasses",
    "selectors",
    "maxCount",
    "runtimeClasses",
    "extendedResources",
    "identities",
)
POOL_KEYS = ("nodeSelector", "protectedLabels", "protectedTaints")
IDENTITY_KEYS = ("user", "groups", "group", "serviceAccount")

#: The namespace label that lets a namespace's claims ask for ``adminAccess`` (KEP-5018; the
#: API server's own check, ``pkg/registry/resource/utils.go``).
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
#: KEP-5004's implicit extended resource name of every DeviceClass: this prefix + the class.
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
#: The label the API server sets on every namespace itself (immutable): never "protected".
METADATA_NAME_LABEL = "kubernetes.io/metadata.name"
#: Always exempt: the API server's own superuser group.
MASTERS = "system:masters"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Identity:
    """Whom the audit impersonates: a user with groups, a ServiceAccount, or a bare group."""

    user: str
    groups: tuple[str, ...] = ()
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.user


@dataclass(frozen=True)
class Tenant:
    """One tenant: its namespaces (a label selector) and what its claims and pods may use."""

    name: str
    namespace_selector: Mapping[str, Any]
    device_classes: tuple[str, ...]
    selectors: tuple[str, ...]
    max_count: int
    runtime_classes: tuple[str, ...]
    extended_resources: tuple[str, ...]
    identities: tuple[Identity, ...]
    index: int

    def field(self, name: str) -> str:
        """The dotted path of one of this tenant's fields in the file."""
        return f"tenants[{self.index}].{name}" if name else f"tenants[{self.index}]"


@dataclass(frozen=True)
class Tenancy:
    """A parsed tenancy file.

    Attributes:
        path: the file, for messages.
        name: ``metadata.name``; every rendered object's name starts ``rollout-tenancy-<name>``.
        admin_groups, admin_users: platform administrators (``system:masters`` always is one).
        driver_service_accounts: ``namespace/name`` of DRA drivers (they write ResourceSlices).
        node_selector: the pool's nodes (label ``key: value`` pairs), where the audit probes.
        protected_labels, protected_taints: node label and taint keys only admins may change.
        tenants: in file order.
        lines: 1-based line of each dotted field.
    """

    path: str
    name: str
    admin_groups: tuple[str, ...]
    admin_users: tuple[str, ...]
    driver_service_accounts: tuple[str, ...]
    node_selector: Mapping[str, str]
    protected_labels: tuple[str, ...]
    protected_taints: tuple[str, ...]
    tenants: tuple[Tenant, ...]
    lines: Mapping[str, int] = field(default_factory=dict)

    def location(self, dotted: str) -> Location:
        f = dotted
        while f and f not in self.lines:
            cut = max(f.rfind("."), f.rfind("["))
            f = f[:cut] if cut > 0 else ""
        return Location(file=self.path, field=dotted, line=self.lines.get(f) if f else None)

    @property
    def prefix(self) -> str:
        return f"rollout-tenancy-{self.name}"

    def protected_namespace_labels(self) -> tuple[str, ...]:
        """The admin-access label and every key the tenants' namespace selectors read: a tenant
        that could change one would move its namespace out of its policy, or into another's."""
        keys = [ADMIN_ACCESS_LABEL]
        for t in self.tenants:
            sel = t.namespace_selector
            keys.extend(str(k) for k in (sel.get("matchLabels") or {}))
            keys.extend(str(e.get("key")) for e in (sel.get("matchExpressions") or ()))
        return tuple(dict.fromkeys(k for k in keys if k != METADATA_NAME_LABEL))

    def tenant(self, name: str) -> Tenant:
        for t in self.tenants:
            if t.name == name:
                return t
        raise InputError(
            f"no tenant {name!r}{suggest(name, [t.name for t in self.tenants])}",
            Location(file=self.path, field="tenants"),
        )


def _strings(v: Any, where: str, loc: Any, required: bool = False) -> tuple[str, ...]:
    if v is None:
        v = []
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise InputError("must be a list of non-empty strings", loc(where))
    if required and not v:
        raise InputError("must name at least one", loc(where))
    dup = [x for i, x in enumerate(v) if x in v[:i]]
    if dup:
        raise InputError(f"{dup[0]!r} is listed twice", loc(where))
    return tuple(v)


def _mapping(v: Any, where: str, loc: Any) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise InputError(f"must be a mapping, got {type(v).__name__}", loc(where))
    return v


def _unknown(m: Mapping[str, Any], allowed: Sequence[str], where: str, loc: Any) -> None:
    for k in m:
        if k not in allowed:
            raise InputError(
                f"unknown field{suggest(str(k), allowed)}",
                loc(f"{where}.{k}" if where else str(k)),
            )


def _identity(v: Any, where: str, loc: Any) -> Identity:
    m = _mapping(v, where, loc)
    _unknown(m, IDENTITY_KEYS, where, loc)
    kinds = [k for k in ("user", "group", "serviceAccount") if k in m]
    if len(kinds) != 1:
        raise InputError("needs exactly one of user, group, serviceAccount", loc(where))
    value = m[kinds[0]]
    if not isinstance(value, str) or not value:
        raise InputError("must be a non-empty string", loc(f"{where}.{kinds[0]}"))
    groups = _strings(m.get("groups"), f"{where}.groups", loc)
    if kinds[0] == "serviceAccount":
        ns, _, name = value.partition("/")
        if not ns or not name or "/" in name:
            raise InputError("must be namespace/name", loc(f"{where}.serviceAccount"))
        # the groups the API server gives a ServiceAccount's token, named explicitly: an
        # impersonated user gets only the groups the request names (and system:authenticated)
        return Identity(
            user=f"system:serviceaccount:{ns}:{name}",
            groups=(*groups, "system:serviceaccounts", f"system:serviceaccounts:{ns}"),
            label=f"serviceaccount {value}",
        )
    if kinds[0] == "group":
        if groups:
            raise InputError("a group identity takes no groups", loc(f"{where}.groups"))
        # impersonation needs a user: a name no one has, in the group alone
        return Identity(
            user=f"rollout-tenancy-audit:{value}", groups=(value,), label=f"group {value}"
        )
    return Identity(user=value, groups=groups, label=f"user {value}")


def _selector(v: Any, where: str, loc: Any) -> Mapping[str, Any]:
    m = _mapping(v, where, loc)
    _unknown(m, ("matchLabels", "matchExpressions"), where, loc)
    labels = _mapping(m.get("matchLabels"), f"{where}.matchLabels", loc)
    for k, val in labels.items():
        if not isinstance(val, str):
            raise InputError("label values must be strings", loc(f"{where}.matchLabels.{k}"))
    exprs = m.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise InputError("must be a list", loc(f"{where}.matchExpressions"))
    for i, e in enumerate(exprs):
        w = f"{where}.matchExpressions[{i}]"
        e = _mapping(e, w, loc)
        _unknown(e, ("key", "operator", "values"), w, loc)
        if e.get("operator") not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise InputError("operator must be In, NotIn, Exists or DoesNotExist", loc(w))
        if not isinstance(e.get("key"), str):
            raise InputError("key must be a string", loc(w))
        _strings(e.get("values"), f"{w}.values", loc, required=e["operator"] in ("In", "NotIn"))
    if not labels and not exprs:
        # an empty selector selects every namespace, kube-system included
        raise InputError("must select by at least one label", loc(where))
    return (
        {"matchLabels": dict(labels), "matchExpressions": list(exprs)}
        if exprs
        else {"matchLabels": dict(labels)}
    )


def label_selector_string(sel: Mapping[str, Any]) -> str:
    """A LabelSelector in the list API's ``labelSelector`` query syntax."""
    parts = [f"{k}={v}" for k, v in (sel.get("matchLabels") or {}).items()]
    for e in sel.get("matchExpressions") or ():
        op, key, vals = e["operator"], e["key"], ",".join(e.get("values") or ())
        parts.append(
            {"In": f"{key} in ({vals})", "NotIn": f"{key} notin ({vals})", "Exists": key}.get(
                op, f"!{key}"
            )
        )
    return ",".join(parts)


def parse(text: str, path: str) -> Tenancy:
    """Parse a tenancy file's text. See :func:`load`."""
    doc = parse_document(text, path, "yaml")
    data, lines = doc.data, doc.lines

    def loc(f: str) -> Location:
        g = f
        while g and g not in lines:
            cut = max(g.rfind("."), g.rfind("["))
            g = g[:cut] if cut > 0 else ""
        return Location(file=path, field=f, line=lines.get(g) if g else None)

    _unknown(data, TOP_LEVEL, "", loc)
    if data.get("apiVersion") != API_VERSION:
        raise InputError(f"apiVersion must be {API_VERSION!r}", loc("apiVersion"))
    if data.get("kind") != KIND:
        raise InputError(f"kind must be {KIND!r}", loc("kind"))
    name = str(_mapping(data.get("metadata"), "metadata", loc).get("name") or "")
    if not _DNS_LABEL.match(name) or len(name) > 40:
        raise InputError(
            "metadata.name must be a DNS label of at most 40 characters", loc("metadata")
        )
    admins = _mapping(data.get("admins"), "admins", loc)
    _unknown(admins, ("groups", "users"), "admins", loc)
    admin_groups = _strings(admins.get("groups"), "admins.groups", loc)
    admin_users = _strings(admins.get("users"), "admins.users", loc)
    if not admin_groups and not admin_users:
        raise InputError(
            "name the platform administrators (groups or users); system:masters always is one",
            loc("admins"),
        )
    drivers = _mapping(data.get("drivers"), "drivers", loc)
    _unknown(drivers, ("serviceAccounts",), "drivers", loc)
    sas = _strings(drivers.get("serviceAccounts"), "drivers.serviceAccounts", loc)
    for i, sa in enumerate(sas):
        if sa.count("/") != 1 or sa.startswith("/") or sa.endswith("/"):
            raise InputError("must be namespace/name", loc(f"drivers.serviceAccounts[{i}]"))
    pool = _mapping(data.get("pool"), "pool", loc)
    _unknown(pool, POOL_KEYS, "pool", loc)
    node_selector = _mapping(pool.get("nodeSelector"), "pool.nodeSelector", loc)
    for k, v in node_selector.items():
        if not isinstance(v, str):
            raise InputError("label values must be strings", loc(f"pool.nodeSelector.{k}"))
    protected_labels = _strings(pool.get("protectedLabels"), "pool.protectedLabels", loc)
    protected_taints = _strings(pool.get("protectedTaints"), "pool.protectedTaints", loc)
    for i, taint in enumerate(protected_taints):
        if taint.startswith("node.kubernetes.io/"):
            raise InputError(
                "node.kubernetes.io/ taints are the node controllers' (cordon, not-ready): "
                "protecting one would stop them",
                loc(f"pool.protectedTaints[{i}]"),
            )
    raw = data.get("tenants")
    if not isinstance(raw, list) or not raw:
        raise InputError("must be a non-empty list", loc("tenants"))
    tenants: list[Tenant] = []
    for i, item in enumerate(raw):
        w = f"tenants[{i}]"
        t = _mapping(item, w, loc)
        _unknown(t, TENANT_KEYS, w, loc)
        tname = t.get("name")
        if not isinstance(tname, str) or not _DNS_LABEL.match(tname) or len(tname) > 40:
            raise InputError("must be a DNS label of at most 40 characters", loc(f"{w}.name"))
        if any(x.name == tname for x in tenants):
            raise InputError(f"tenant {tname!r} is listed twice", loc(f"{w}.name"))
        if "namespaceSelector" not in t:
            raise InputError("is required", loc(f"{w}.namespaceSelector"))
        max_count = t.get("maxCount")
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
            raise InputError("must be a whole number >= 1", loc(f"{w}.maxCount"))
        idents = t.get("identities") or []
        if not isinstance(idents, list):
            raise InputError("must be a list", loc(f"{w}.identities"))
        tenants.append(
            Tenant(
                name=tname,
                namespace_selector=_selector(t["namespaceSelector"], f"{w}.namespaceSelector", loc),
                device_classes=_strings(
                    t.get("deviceClasses"), f"{w}.deviceClasses", loc, required=True
                ),
                selectors=_strings(t.get("selectors"), f"{w}.selectors", loc),
                max_count=max_count,
                runtime_classes=_strings(
                    t.get("runtimeClasses"), f"{w}.runtimeClasses", loc, required=True
                ),
                extended_resources=_strings(
                    t.get("extendedResources"), f"{w}.extendedResources", loc
                ),
                identities=tuple(
                    _identity(x, f"{w}.identities[{j}]", loc) for j, x in enumerate(idents)
                ),
                index=i,
            )
        )
    return Tenancy(
        path=path,
        name=name,
        admin_groups=admin_groups,
        admin_users=admin_users,
        driver_service_accounts=sas,
        node_selector={str(k): str(v) for k, v in node_selector.items()},
        protected_labels=protected_labels,
        protected_taints=protected_taints,
        tenants=tuple(tenants),
        lines=dict(lines),
    )


def load(path: Path | str) -> Tenancy:
    """Read and parse a tenancy file.

    Raises:
        InputError: missing file, unknown field (with a suggestion), wrong types or values
            (file, field and line named).
        ParseError: malformed YAML.
    """
    p = Path(path)
    text = read_input(p)
    return parse(text, str(p))


# --- rendering -------------------------------------------------------------------------------


def cel_string(s: str) -> str:
    """``s`` as a CEL double-quoted string literal (backslash, quote and control characters
    escaped), so a selector is compared verbatim and can never end the literal."""
    out = []
    for ch in s:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def cel_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(cel_string(x) for x in items) + "]"


GROUP = "admissionregistration.k8s.io/v1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "rollout"}


def _not_admin(t: Tenancy) -> dict[str, str]:
    groups = cel_list((MASTERS, *t.admin_groups))
    users = cel_list(t.admin_users)
    return {
        "name": "not-a-platform-administrator",
        "expression": f"!request.userInfo.groups.exists(g, g in {groups})"
        f" && !(request.userInfo.username in {users})",
    }


def _policy(
    name: str,
    reason: str,
    rules: list[dict[str, Any]],
    validations: list[dict[str, Any]],
    variables: list[dict[str, str]] | None = None,
    match_conditions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": {"matchPolicy": "Equivalent", "resourceRules": rules},
    }
    if match_conditions:
        spec["matchConditions"] = match_conditions
    if variables:
        spec["variables"] = variables
    spec["validations"] = validations
    return {
        "apiVersion": GROUP,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {
            "name": name,
            "labels": dict(MANAGED_BY),
            "annotations": {"rollout.dev/why": reason},
        },
        "spec": spec,
    }


def _binding(name: str, namespace_selector: Mapping[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": name, "validationActions": ["Deny"]}
    if namespace_selector is not None:
        spec["matchResources"] = {"namespaceSelector": dict(namespace_selector)}
    return {
        "apiVersion": GROUP,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": spec,
    }


def _v(name: str, expression: str) -> dict[str, str]:
    return {"name": name, "expression": expression}


def _check(expression: str, message: str, dynamic: bool = False) -> dict[str, str]:
    key = "messageExpression" if dynamic else "message"
    return {"expression": expression, key: message, "reason": "Forbidden"}


def claims_policy(t: Tenancy, tenant: Tenant) -> dict[str, Any]:
    """Claims and claim templates in the tenant's namespaces: only its classes, verbatim
    selectors and ExactCount up to its cap, in ``exactly`` and in every ``firstAvailable``
    alternative; no adminAccess, no device taint tolerations, no opaque driver config.

    Bound by namespace, not by user: claims the scheduler (KEP-5004's extended resource claims)
    and the resource-claim controller (from templates) create in a tenant namespace are judged
    the same way (``docs/tenancy.md``).

    CREATE only: the API server refuses any change to a claim's or a template's spec, so an
    update has nothing to judge, and judging it would refuse the controllers' own updates (the
    finalizer removed when a claim is released) of a claim created before the list tightened,
    or by an administrator: such a claim would never go away."""
    who = f"tenant {tenant.name}: "
    each = (
        "variables.requests.all(r, has(r.exactly) ? {x}"
        " : r.?firstAvailable.orValue([]).all(s, {y}))"
    )

    def both(pred: str) -> str:
        return each.format(x=pred.replace("$", "r.exactly"), y=pred.replace("$", "s"))

    return _policy(
        f"{t.prefix}-claims-{tenant.name}",
        "DeviceClasses, selectors and counts a tenant may claim (rollout tenancy render)",
        [
            {
                "apiGroups": ["resource.k8s.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["resourceclaims", "resourceclaimtemplates"],
            }
        ],
        [
            _check(
                both("$.deviceClassName in variables.classes"),
                f"'{who}deviceClassName must be one of: ' + variables.classes.join(', ')",
                dynamic=True,
            ),
            _check(
                both("$.?selectors.orValue([]).all(x, x.cel.expression in variables.selectors)"),
                f"{who}device selectors must be taken verbatim from the platform's allowlist",
            ),
            _check(
                both(
                    "$.?allocationMode.orValue('ExactCount') == 'ExactCount'"
                    " && $.?count.orValue(1) <= variables.maxCount"
                ),
                f"'{who}allocationMode must be ExactCount with count <= ' + "
                "string(variables.maxCount)",
                dynamic=True,
            ),
            _check(
                "!variables.requests.exists(r, has(r.exactly)"
                " && r.exactly.?adminAccess.orValue(false))",
                f"{who}adminAccess is reserved to platform administrators",
            ),
            _check(
                both("size($.?tolerations.orValue([])) == 0"),
                f"{who}device taint tolerations are reserved to platform administrators",
            ),
            _check(
                "size(variables.spec.?devices.?config.orValue([])) == 0",
                f"{who}opaque driver configuration comes from the DeviceClass only",
            ),
        ],
        variables=[
            _v(
                "spec",
                "request.kind.kind == 'ResourceClaimTemplate' ? object.spec.spec : object.spec",
            ),
            _v("requests", "variables.spec.?devices.?requests.orValue([])"),
            _v("classes", cel_list(tenant.device_classes)),
            _v("selectors", cel_list(tenant.selectors)),
            _v("maxCount", str(tenant.max_count)),
        ],
        match_conditions=[_not_admin(t)],
    )


def pods_policy(t: Tenancy, tenant: Tenant, dra_names: Mapping[str, str]) -> dict[str, Any]:
    """Pods in the tenant's namespaces that use devices (resource claims, KEP-5004 explicit or
    implicit extended resources, the device plugin's resource) need an allowed RuntimeClass,
    and each container asks for at most ``maxCount`` of each such resource.

    ``dra_names``: each DRA-backed explicit extended resource name in the cluster -> its
    DeviceClass (``spec.extendedResourceName``, read when rendering). A name backed by a class
    off the tenant's list is refused outright: the scheduler's claim for it would be refused
    at PreBind and the pod would stay Pending."""
    who = f"tenant {tenant.name}: "
    allowed = list(tenant.extended_resources) + sorted(
        n for n, c in dra_names.items() if c in tenant.device_classes
    )
    device_names = sorted({*tenant.extended_resources, *dra_names})
    lists = ("c.?resources.?limits.orValue({})", "c.?resources.?requests.orValue({})")

    def every(pred: str) -> str:
        return " && ".join(f"variables.containers.all(c, {m}.all(k, {pred}))" for m in lists)

    def any_(pred: str) -> str:
        return " || ".join(f"variables.containers.exists(c, {m}.exists(k, {pred}))" for m in lists)

    is_device = f"(k in variables.deviceNames || k.startsWith('{IMPLICIT_PREFIX}'))"
    caps = []
    for m in lists:
        caps.append(
            f"variables.containers.all(c, {m}.all(k, !{is_device} || "
            f"quantity({m}[k]).compareTo(quantity(string(variables.maxCount))) <= 0))"
        )
    return _policy(
        f"{t.prefix}-pods-{tenant.name}",
        "RuntimeClass and device counts of a tenant's pods (rollout tenancy render)",
        [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
            }
        ],
        [
            _check(
                "!variables.usesDevices || "
                "object.spec.?runtimeClassName.orValue('') in variables.runtimeClasses",
                f"'{who}pods with devices must use runtimeClassName one of: ' + "
                "variables.runtimeClasses.join(', ')",
                dynamic=True,
            ),
            _check(
                every(
                    f"!k.startsWith('{IMPLICIT_PREFIX}') || "
                    f"k.substring({len(IMPLICIT_PREFIX)}) in variables.classes"
                ),
                f"'{who}implicit DRA extended resource names must name a DeviceClass of: ' + "
                "variables.classes.join(', ')",
                dynamic=True,
            ),
            _check(
                every("!(k in variables.deviceNames) || k in variables.allowedNames"),
                f"'{who}device resources must be one of: ' + variables.allowedNames.join(', ')",
                dynamic=True,
            ),
            _check(
                " && ".join(caps),
                f"'{who}each container may ask for at most ' + string(variables.maxCount) + "
                "' of a device resource'",
                dynamic=True,
            ),
        ],
        variables=[
            _v("containers", "object.spec.containers + object.spec.?initContainers.orValue([])"),
            _v("runtimeClasses", cel_list(tenant.runtime_classes)),
            _v("classes", cel_list(tenant.device_classes)),
            _v("deviceNames", cel_list(device_names)),
            _v("allowedNames", cel_list(allowed)),
            _v("maxCount", str(tenant.max_count)),
            _v(
                "usesDevices",
                "size(object.spec.?resourceClaims.orValue([])) > 0 || " + any_(is_device),
            ),
        ],
        match_conditions=[_not_admin(t)],
    )


def namespace_policy(t: Tenancy) -> dict[str, Any]:
    """Only administrators set, change or remove the admin-access label and the labels the
    tenants' namespace selectors read, on any namespace (creation included)."""
    keys = t.protected_namespace_labels()
    return _policy(
        f"{t.prefix}-namespace-labels",
        "the admin-access label and the tenant labels stay with administrators",
        [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["namespaces"],
            }
        ],
        [
            _check(
                "variables.keys.all(k, (k in object.metadata.?labels.orValue({})) == "
                "(request.operation == 'UPDATE' && k in oldObject.metadata.?labels.orValue({}))"
                " && object.metadata.?labels[?k].orValue('') == (request.operation == 'UPDATE'"
                " ? oldObject.metadata.?labels[?k].orValue('') : ''))",
                "'only platform administrators may set, change or remove the namespace labels: '"
                " + variables.keys.join(', ')",
                dynamic=True,
            )
        ],
        variables=[_v("keys", cel_list(keys))],
        match_conditions=[_not_admin(t)],
    )


def node_policy(t: Tenancy) -> dict[str, Any]:
    """Only administrators change the pool's protected node labels and taints (on every Node:
    adding the pool's label to another node would move that node into the pool)."""
    return _policy(
        f"{t.prefix}-pool-nodes",
        "the GPU pool's protected node labels and taints stay with administrators",
        [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["UPDATE"],
                "resources": ["nodes"],
            }
        ],
        [
            _check(
                "variables.labels.all(k, (k in object.metadata.?labels.orValue({})) == "
                "(k in oldObject.metadata.?labels.orValue({})) && "
                "object.metadata.?labels[?k].orValue('') == "
                "oldObject.metadata.?labels[?k].orValue(''))",
                "'only platform administrators may change the node labels: ' + "
                "variables.labels.join(', ')",
                dynamic=True,
            ),
            _check(
                "variables.taints.all(k, "
                "object.spec.?taints.orValue([]).filter(x, x.key == k)"
                ".map(x, x.?value.orValue('') + ':' + x.effect) == "
                "oldObject.spec.?taints.orValue([]).filter(x, x.key == k)"
                ".map(x, x.?value.orValue('') + ':' + x.effect))",
                "'only platform administrators may change the node taints: ' + "
                "variables.taints.join(', ')",
                dynamic=True,
            ),
        ],
        variables=[
            _v("labels", cel_list(t.protected_labels)),
            _v("taints", cel_list(t.protected_taints)),
        ],
        match_conditions=[_not_admin(t)],
    )


def dra_objects_policy(t: Tenancy) -> dict[str, Any]:
    """DeviceClasses and DeviceTaintRules: administrators only. ResourceSlices: administrators,
    the kubelets (they publish and wipe their node's slices; NodeRestriction keeps each to its
    own), the named drivers and kube-system's controllers (the garbage collector removes a
    deleted Node's slices). RBAC should already say so (the admin guide: "DeviceClasses and
    ResourceSlices should be restricted to admins and the DRA drivers"); this holds where a
    binding says more."""
    drivers = [f"system:serviceaccount:{sa.replace('/', ':')}" for sa in t.driver_service_accounts]
    slice_writer = (
        "request.resource.resource == 'resourceslices' && ("
        "request.userInfo.groups.exists(g, g in "
        "['system:nodes', 'system:serviceaccounts:kube-system'])"
        " || request.userInfo.username in "
        f"{cel_list(['system:kube-controller-manager', *drivers])})"
    )
    cond = _not_admin(t)
    return _policy(
        f"{t.prefix}-dra-objects",
        "DeviceClasses, ResourceSlices and DeviceTaintRules: administrators and drivers only",
        [
            {
                "apiGroups": ["resource.k8s.io"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": ["deviceclasses", "resourceslices", "devicetaintrules"],
            }
        ],
        [
            _check(
                "false",
                "'only platform administrators and DRA drivers may write ' + "
                "request.resource.resource",
                dynamic=True,
            )
        ],
        match_conditions=[
            cond,
            {"name": "not-a-slice-publisher", "expression": f"!({slice_writer})"},
        ],
    )


def render(t: Tenancy, dra_names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every ValidatingAdmissionPolicy and its binding, in apply order (each policy before its
    binding). ``dra_names``: see :func:`pods_policy` (the live cluster's, read by the caller)."""
    out: list[dict[str, Any]] = []
    names = dict(dra_names or {})
    for tenant in t.tenants:
        for pol in (claims_policy(t, tenant), pods_policy(t, tenant, names)):
            out += [pol, _binding(pol["metadata"]["name"], tenant.namespace_selector)]
    rest = [namespace_policy(t), dra_objects_policy(t)]
    if t.protected_labels or t.protected_taints:
        rest.append(node_policy(t))
    for pol in rest:
        out += [pol, _binding(pol["metadata"]["name"])]
    return out


def expected_refuser(t: Tenancy, tenant: Tenant, case_kind: str) -> str:
    """The rendered policy that should refuse a forbidden request of ``case_kind`` (claims,
    pods, namespaces, nodes, dra)."""
    return {
        "claims": f"{t.prefix}-claims-{tenant.name}",
        "pods": f"{t.prefix}-pods-{tenant.name}",
        "namespaces": f"{t.prefix}-namespace-labels",
        "nodes": f"{t.prefix}-pool-nodes",
        "dra": f"{t.prefix}-dra-objects",
    }[case_kind]
