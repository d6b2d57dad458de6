"""``rollout tenancy render|audit``: the GPU pool's tenant isolation policy, rendered from a
tenancy file, and proven against the live API server by trying what it forbids.

Thin: ``rollout.change.tenancy.policy`` parses and renders, ``rollout.change.tenancy.live_checks``
checks the file against the cluster, ``rollout.change.tenancy.audit`` tries; this prints.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click
import yaml

from rollout.errors import InputError, Location

from .options import kube_options

if TYPE_CHECKING:
    from rollout.change.tenancy.audit import Audit
    from rollout.kube.tenancy import TenancyApi

file_option = click.option(
    "-f",
    "--file",
    "path",
    required=True,
    envvar="ROLLOUT_TENANCY",
    type=click.Path(dir_okay=False),
    help="The tenancy file (kind: TenancyPolicy; docs/tenancy.md).",
)


@click.group("tenancy")
def tenancy_group() -> None:
    """Tenant isolation of a GPU pool: render the admission policy, audit it live.

    \b
    Examples:
      rollout tenancy render -f tenancy.yaml > policy.yaml
      rollout tenancy audit -f tenancy.yaml -o json
    """


@tenancy_group.command("render")
@file_option
@click.option(
    "-o",
    "--output",
    type=click.Choice(["yaml", "json"]),
    default="yaml",
    show_default=True,
    help="Output format: YAML documents for kubectl apply or GitOps, or a JSON List.",
)
@click.option(
    "--offline",
    is_flag=True,
    help="Render without the cluster: skip the checks that classes and RuntimeClasses exist, "
    "selectors compile and namespace selectors match (said on stderr).",
)
@click.option(
    "--apply",
    "do_apply",
    is_flag=True,
    help="Also write the policies and bindings to the cluster (server-side apply, field "
    "manager rollout-tenancy). Needs --yes, or --dry-run.",
)
@click.option("--dry-run", is_flag=True, help="With --apply: the API server's dry run only.")
@click.option("--yes", is_flag=True, help="With --apply: write without asking.")
@kube_options
def render_cmd(
    path: str,
    output: str,
    offline: bool,
    do_apply: bool,
    dry_run: bool,
    yes: bool,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Render ValidatingAdmissionPolicies and bindings from a tenancy file: per tenant, the
    DeviceClasses, verbatim selectors and ExactCount cap its ResourceClaims and templates may
    use (firstAvailable included; no adminAccess, device taint tolerations or opaque config),
    the RuntimeClass and per-container count its device pods need; the admin-access and tenant
    namespace labels, the pool's protected node labels and taints, DeviceClasses and
    ResourceSlices kept to administrators (and drivers).

    The file is checked against the cluster first: a DeviceClass or RuntimeClass that does
    not exist, a selector that does not compile (the API server compiles it, dry run), a
    namespace selector that matches no namespace: exit 2 naming file, field and line, nothing
    rendered. The tool writes no policy unless --apply is given with --yes (or --dry-run).

    \b
    Examples:
      rollout tenancy render -f tenancy.yaml > policy.yaml && kubectl apply -f policy.yaml
      rollout tenancy render -f tenancy.yaml --offline -o json
      rollout tenancy render -f tenancy.yaml --apply --dry-run
      rollout tenancy render -f tenancy.yaml --apply --yes
    """
    from rollout.change.tenancy.policy import load, render

    if do_apply and offline:
        raise InputError("--apply needs the cluster; drop --offline", Location(field="--offline"))
    if do_apply and not (yes or dry_run):
        raise InputError(
            "--apply writes the policies to the cluster: add --yes, or --dry-run to let the API "
            "server check them without writing",
            Location(field="--yes"),
        )
    t = load(path)
    dra_names: dict[str, str] = {}
    if offline:
        click.echo(
            "warning: --offline: DeviceClasses, RuntimeClasses, selectors and namespace "
            "selectors were not checked against a cluster, and DRA-backed extended resource "
            "names were not read",
            err=True,
        )
    else:
        from rollout.change.tenancy.live_checks import read_facts
        from rollout.kube.client import connect
        from rollout.kube.tenancy import TenancyApi

        kapi = TenancyApi(connect(kubeconfig, context))
        facts = read_facts(t, kapi)
        for w in facts.warnings:
            click.echo(f"warning: {w}", err=True)
        dra_names = dict(facts.dra_names)
    objs = render(t, dra_names)
    if do_apply:
        _apply(kapi, objs, dry_run, output)
        return
    if output == "json":
        click.echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}, indent=2))
    else:
        click.echo(
            f"# rendered by rollout tenancy render from {path}; docs/tenancy.md explains each rule",
        )
        click.echo(yaml.safe_dump_all(objs, sort_keys=False, width=100), nl=False)


def _apply(kapi: TenancyApi, objs: list[dict[str, Any]], dry_run: bool, output: str) -> None:
    from rollout.errors import ExternalError

    results = []
    for obj in objs:
        meta = obj["metadata"]
        ans = kapi.apply(obj, dry_run)
        results.append(
            {
                "kind": obj["kind"],
                "name": meta["name"],
                "applied": ans.allowed,
                "dryRun": dry_run,
                "message": ans.message,
            }
        )
        if output != "json":
            verb = "would apply" if dry_run else "applied"
            click.echo(
                f"{verb} {obj['kind']} {meta['name']}"
                if ans.allowed
                else f"refused {obj['kind']} {meta['name']}: {ans.message}",
                err=True,
            )
        if not ans.allowed:
            break
    if output == "json":
        click.echo(json.dumps({"dryRun": dry_run, "objects": results}, indent=2))
    if not all(r["applied"] for r in results):
        raise ExternalError("the API server refused a policy object (above); later ones not sent")


@tenancy_group.command("audit")
@file_option
@click.option("--tenant", help="The tenant the --user/--group/--service-account identities are.")
@click.option("--user", help="Try as this user (with the --group groups).")
@click.option("--group", "groups", multiple=True, help="A group (repeatable).")
@click.option(
    "--service-account",
    "service_accounts",
    multiple=True,
    help="Try as this ServiceAccount, namespace/name (repeatable).",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format.",
)
@kube_options
def audit_cmd(
    path: str,
    tenant: str | None,
    user: str | None,
    groups: tuple[str, ...],
    service_accounts: tuple[str, ...],
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Prove the tenant isolation by trying: as each tenant identity (impersonated, every
    request a server-side dry run, nothing written), ask for what the file forbids (an
    adminAccess claim, a class or selector off the list, a count over the cap, a pod without
    the RuntimeClass, the admin-access namespace label, a DeviceClass, a ResourceSlice, a pool
    node's protected label or taint) and for what it allows. Also: which of the writes only
    administrators may hold RBAC grants a tenant (the binding named), a tenant namespace
    already labelled admin-access, and the rendered policies on the server as rendered.

    Each forbidden request let through names the RBAC binding and the policy that should
    have refused it; each allowed request refused names who refused it. Exit 0 only when every
    row is as expected; 1 when one is not, or when something could not be tried (an API the
    server does not serve, impersonation refused): never a pass for what was not tried.
    The identities come from the file (tenants[].identities) or, for one --tenant, from
    --user/--group/--service-account. The RBAC the audit needs: deploy/tenancy-audit-rbac.yaml.

    \b
    Examples:
      rollout tenancy audit -f tenancy.yaml
      rollout tenancy audit -f tenancy.yaml --tenant team-a --user alice --group team-a
      rollout tenancy audit -f tenancy.yaml --tenant team-a --service-account team-a/ci -o json
    """
    from rollout.change.tenancy.audit import run_audit
    from rollout.change.tenancy.live_checks import read_facts
    from rollout.change.tenancy.policy import Identity, load
    from rollout.kube.client import connect
    from rollout.kube.tenancy import TenancyApi

    t = load(path)
    identities: dict[str, tuple[Identity, ...]] = {}
    if user or groups or service_accounts:
        if tenant is None and len(t.tenants) != 1:
            raise InputError(
                "the file has several tenants: name the identities' one with --tenant",
                Location(field="--tenant"),
            )
        tn = t.tenant(tenant) if tenant else t.tenants[0]
        who: list[Identity] = []
        if user:
            who.append(Identity(user, groups, f"user {user}"))
        else:
            who += [Identity(f"rollout-tenancy-audit:{g}", (g,), f"group {g}") for g in groups]
        for sa in service_accounts:
            ns, _, name = sa.partition("/")
            if not ns or not name:
                raise InputError("must be namespace/name", Location(field="--service-account"))
            who.append(
                Identity(
                    f"system:serviceaccount:{ns}:{name}",
                    ("system:serviceaccounts", f"system:serviceaccounts:{ns}"),
                    f"serviceaccount {sa}",
                )
            )
        identities[tn.name] = tuple(who)
    kapi = TenancyApi(connect(kubeconfig, context))
    facts = read_facts(t, kapi, require_dra=False)
    for w in facts.warnings:
        click.echo(f"warning: {w}", err=True)
    audit = run_audit(t, kapi, facts, identities, lambda m: click.echo(m, err=True))
    if output == "json":
        click.echo(json.dumps(audit.to_json(), indent=2))
    else:
        _print(audit)
    if audit.result != "pass":
        sys.exit(1)


def _print(audit: Audit) -> None:
    for r in audit.rows:
        mark = "ok  " if r.ok and r.got != "untested" else ("SKIP" if r.ok else "FAIL")
        who = " ".join(x for x in (r.tenant, r.identity) if x)
        head = f"{mark} {r.kind:9} {who + ': ' if who else ''}{r.case}"
        line = f"{head}: expected {r.expect}, got {r.got}"
        if r.by:
            line += f" ({r.by})"
        click.echo(line)
        if r.detail and (not r.ok or r.got == "untested"):
            click.echo(f"       {r.detail}")
    failed = sum(1 for r in audit.rows if not r.ok)
    untested = sum(1 for r in audit.rows if r.got == "untested")
    click.echo(f"{audit.result}: {len(audit.rows)} checks, {failed} failed, {untested} not tried")


COMMANDS = [tenancy_group]
