"""Options shared by several commands, declared once so they read the same everywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

output_option = click.option(
    "-o",
    "--output",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format.",
)

plan_option = click.option(
    "--plan",
    "plan_path",
    envvar="ROLLOUT_PLAN",
    type=click.Path(dir_okay=False),
    help="The plan file (default: $ROLLOUT_PLAN).",
)

inventory_option = click.option(
    "-i",
    "--inventory",
    envvar="ROLLOUT_INVENTORY",
    type=click.Path(exists=True, dir_okay=False),
    help="Ansible inventory (default: $ROLLOUT_INVENTORY).",
)

kubeconfig_option = click.option(
    "--kubeconfig",
    envvar="KUBECONFIG",
    type=click.Path(dir_okay=False),
    help="Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).",
)

context_option = click.option("--context", help="The kubeconfig context to use.")

force_serving_option = click.option(
    "--force-serving",
    metavar="REASON",
    help="Change the nodes although a model-serving canary is in progress (an Argo Rollout or "
    "Flagger Canary being judged, a KServe InferenceService or a Deployment on the nodes rolling "
    "out): refused without it, the device layer and the model layer change in separate "
    "windows; the reason and what was in progress are journaled.",
)


def kube_options(f: F) -> F:
    """Add --kubeconfig and --context, like kubectl."""
    return kubeconfig_option(context_option(f))


def drain_options(f: F) -> F:
    """Add what a drain may lose, kubectl drain's rules: --force-delete-unmanaged (kubectl's
    ``--force``, renamed: ``--force`` here means "override a refusal, REASON given") and
    --delete-emptydir-data (kubectl's own name); and --capacity-warn-only for the capacity
    check."""
    f = click.option(
        "--force-delete-unmanaged",
        "delete_unmanaged",
        is_flag=True,
        help="Evict pods that declare no controller (no ownerReference with controller: true; "
        "nothing recreates them): kubectl drain's --force. Without it a node holding one is "
        "refused before it is cordoned. Journaled.",
    )(f)
    f = click.option(
        "--capacity-warn-only",
        is_flag=True,
        help="Warn instead of refusing when the pods a batch evicts have no room elsewhere (the "
        "per-resource sums, GPUs included, and each pod's nodeSelector, affinity and "
        "tolerations). Journaled.",
    )(f)
    return click.option(
        "--delete-emptydir-data",
        "delete_emptydir_data",
        is_flag=True,
        help="Evict pods with emptyDir volumes (their data is deleted), as kubectl drain's flag "
        "of that name. Without it a node holding one is refused before it is cordoned. Journaled.",
    )(f)
