"""What the tenancy file names, checked against the live API server before anything renders:
every DeviceClass and RuntimeClass exists, every selector compiles as the API server's own DRA
CEL, every tenant's namespace selector matches at least one namespace.

Why ask the API server to compile the selectors: the selector language is Kubernetes' DRA CEL
environment (``device.attributes``, ``device.capacity``, semver and quantity libraries, a cost
limit), which no Python library reproduces. A server-side dry-run create of a ResourceClaim
that carries the selector runs the API server's own validation, which compiles it with that
environment and answers 422 with the compiler's message when it does not compile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rollout.change.tenancy.policy import Tenancy, label_selector_string
from rollout.errors import InputError, PreflightError, suggest
from rollout.kube.tenancy import TenancyApi

RESOURCE_V1 = "resource.k8s.io/v1"
ADMISSION_V1 = "admissionregistration.k8s.io/v1"


@dataclass(frozen=True)
class LiveFacts:
    """What rendering and the audit read from the cluster.

    Attributes:
        namespaces: each tenant's namespaces (sorted), by tenant name.
        dra_names: each DRA-backed explicit extended resource name -> its DeviceClass.
        classes: every DeviceClass name.
        warnings: things worth saying that do not stop rendering.
    """

    namespaces: Mapping[str, tuple[str, ...]]
    dra_names: Mapping[str, str]
    classes: tuple[str, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)


def read_facts(t: Tenancy, kapi: TenancyApi, require_dra: bool = True) -> LiveFacts:
    """Check the file against the cluster and read what rendering needs. ``require_dra``
    False (the audit): an API server without ``resource.k8s.io/v1`` is a warning, and the
    class and selector checks are left out (the audit then says what it could not try).

    Raises:
        InputError: a class or RuntimeClass that does not exist, a selector that does not
            compile, a namespace selector that matches no namespace (file, field, line named).
        PreflightError: the API server does not serve ``resource.k8s.io/v1``.
    """
    dra = kapi.served(RESOURCE_V1)
    warnings: list[str] = []
    if not dra:
        msg = (
            f"the API server does not serve {RESOURCE_V1} (DRA): the classes and selectors "
            "in the file cannot be checked, and a policy over them would match nothing"
        )
        if require_dra:
            raise PreflightError(msg)
        warnings.append(msg)
    classes = (
        {c["metadata"]["name"]: c for c in kapi.list(f"/apis/{RESOURCE_V1}/deviceclasses")}
        if dra
        else {}
    )
    namespaces: dict[str, tuple[str, ...]] = {}
    for tenant in t.tenants:
        sel = label_selector_string(tenant.namespace_selector)
        found = sorted(n["metadata"]["name"] for n in kapi.list("/api/v1/namespaces", sel))
        if not found:
            raise InputError(
                f"matches no namespace (labelSelector {sel!r})",
                t.location(tenant.field("namespaceSelector")),
            )
        namespaces[tenant.name] = tuple(found)
        for j, cls in enumerate(tenant.device_classes if dra else ()):
            if cls not in classes:
                raise InputError(
                    f"DeviceClass {cls!r} does not exist{suggest(cls, classes)}",
                    t.location(tenant.field(f"deviceClasses[{j}]")),
                )
        for j, rc in enumerate(tenant.runtime_classes):
            if kapi.get(f"/apis/node.k8s.io/v1/runtimeclasses/{rc}") is None:
                raise InputError(
                    f"RuntimeClass {rc!r} does not exist",
                    t.location(tenant.field(f"runtimeClasses[{j}]")),
                )
        for j, expr in enumerate(tenant.selectors if dra else ()):
            body = {
                "apiVersion": RESOURCE_V1,
                "kind": "ResourceClaim",
                "metadata": {"name": "rollout-tenancy-selector-check", "namespace": found[0]},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "check",
                                "exactly": {
                                    "deviceClassName": tenant.device_classes[0],
                                    "selectors": [{"cel": {"expression": expr}}],
                                },
                            }
                        ]
                    }
                },
            }
            ans = kapi.dry_run_create(
                f"/apis/{RESOURCE_V1}/namespaces/{found[0]}/resourceclaims", body
            )
            # 422: the API server's validation refused it (the compiler's message); 403: it
            # passed validation and an admission policy or RBAC judged it (so it compiled)
            if ans.status == 422:
                raise InputError(
                    f"the selector does not compile as DRA CEL; the API server says: {ans.message}",
                    t.location(tenant.field(f"selectors[{j}]")),
                )
    dra_names = {
        str(c["spec"]["extendedResourceName"]): name
        for name, c in sorted(classes.items())
        if (c.get("spec") or {}).get("extendedResourceName")
    }
    for tenant in t.tenants:
        for j, er in enumerate(tenant.extended_resources):
            backing = dra_names.get(er)
            if backing and backing not in tenant.device_classes:
                warnings.append(
                    f"{t.location(tenant.field(f'extendedResources[{j}]')).describe()}: "
                    f"{er!r} is backed by DeviceClass {backing!r}, not on the tenant's list: on a "
                    "node where DRA serves it, the scheduler's claim is refused and the pod "
                    "stays Pending"
                )
    return LiveFacts(
        namespaces=namespaces,
        dra_names=dra_names,
        classes=tuple(sorted(classes)),
        warnings=tuple(warnings),
    )
