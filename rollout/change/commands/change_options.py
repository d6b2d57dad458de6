"""What a command that changes nodes was asked for, as one frozen value the CLI builds from its
flags and hands to the session (``rollout.change.commands.apply_change``, ``promote_change``,
``session``).

Why a value: the flags used to travel as a dozen keyword arguments, repeated at each hop from
the command to the run; a value is built once, checked once, and printed or journaled whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.change.plan.drain_rules import DrainOverrides
from rollout.fanout import DEFAULT_FORKS


@dataclass(frozen=True, kw_only=True)
class ChangeOptions:
    """What every command that changes nodes takes.

    Attributes:
        lock_namespace: the namespace of the rollout-lock Lease and the cluster record.
        verify_timeout: seconds a node has to prove healthy after its kubelet restart.
        forks: at most this many nodes at once.
    """

    lock_namespace: str = "kube-system"
    verify_timeout: float = 120.0
    forks: int = DEFAULT_FORKS


@dataclass(frozen=True, kw_only=True)
class ApplyOptions(ChangeOptions):
    """``rollout apply``'s flags.

    Attributes:
        canary: change only the canary group, then hold.
        dry_run: check and print; change nothing.
        accept_rejections: go on although running pods are predicted rejected.
        force: the reason the device refusals are overridden (None: they stand).
        force_window: the reason the change runs outside its windows (None: windows hold).
        force_serving: the reason the change runs while a model-serving canary is in progress
            (None: such a canary refuses; :mod:`rollout.kube.canaries`).
        overrides: what the drains may lose (kubectl drain's flags).
        disable_eviction: delete pods instead of evicting them.
        require_evidence: the canary's gate requires its ``after`` evidence (the plan's
            ``gate.requireEvidence``; :class:`rollout.change.commands.apply_change.EvidenceGate`).
        recreate_probes: once the nodes are applied, collect ``after-recreate`` around a device
            probe recreated on each (:mod:`rollout.evidence.recreating`).
        recreate_workloads: once the nodes are applied, evict their controllers' GPU and
            Guaranteed pods one controller at a time, wait for the replacements and collect
            ``after-recreate`` (:mod:`rollout.change.commands.recreate_workloads`; the operator's
            consent).
    """

    canary: bool = False
    dry_run: bool = False
    accept_rejections: bool = False
    force: str | None = None
    force_window: str | None = None
    force_serving: str | None = None
    overrides: DrainOverrides = field(default_factory=DrainOverrides)
    disable_eviction: bool = False
    require_evidence: bool = False
    recreate_probes: bool = False
    recreate_workloads: bool = False


@dataclass(frozen=True, kw_only=True)
class PromoteOptions(ChangeOptions):
    """``rollout promote``'s flags.

    Attributes:
        plan_path: the plan (None: the one the change recorded).
        inventory: the inventory (None: the one the change recorded).
        dry_run: check and print; change nothing.
        force: the reason a refusal is overridden (None: it stands).
        force_window: the reason the promotion runs outside the windows.
        force_serving: the reason the promotion runs while a model-serving canary is in
            progress (None: such a canary refuses).
        overrides: what the drains may lose.
        recreate_workloads: once the promoted nodes are applied, recreate their controllers'
            GPU and Guaranteed pods and collect ``after-recreate`` (as ``apply``'s).
    """

    plan_path: str | None = None
    inventory: str | None = None
    dry_run: bool = False
    force: str | None = None
    force_window: str | None = None
    force_serving: str | None = None
    overrides: DrainOverrides = field(default_factory=DrainOverrides)
    recreate_workloads: bool = False
