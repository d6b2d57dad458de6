"""The orchestrator's ``Cluster`` Protocol over the real API server."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollout.kube import devices, evicting, freeze, nodes, proxy
from rollout.kube.client import Api
from rollout.models import NodeInfo, PodRef
from rollout.protocols import EvictionResult


class KubeCluster:
    """Node operations through the API server; every write is a cordon, an eviction, a
    deletion asked for with ``--disable-eviction``, or (the allocation-path change) a path
    label written compare-and-swap, or (a plan's ``freezeClaims``) the claim freeze's admission
    policy. Also the allocation-path change's ``DeviceWorld`` and ``FreezeWorld``."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._resource_versions: list[str] | None = None

    def node(self, name: str) -> NodeInfo:
        """See ``Cluster.node``."""
        return nodes.node_info(self.api, name)

    def cordon(self, name: str) -> None:
        """See ``Cluster.cordon``."""
        nodes.set_unschedulable(self.api, name, True)

    def uncordon(self, name: str) -> None:
        """See ``Cluster.uncordon``."""
        nodes.set_unschedulable(self.api, name, False)

    def pods_on_node(self, name: str) -> list[PodRef]:
        """See ``Cluster.pods_on_node``."""
        return nodes.pods_on_node(self.api, name)

    def evict(self, pod: PodRef, grace_period_s: int | None) -> EvictionResult:
        """See ``Cluster.evict``."""
        return evicting.evict(self.api, pod, grace_period_s)

    def delete_pod(self, pod: PodRef, grace_period_s: int | None) -> None:
        """See ``Cluster.delete_pod``."""
        evicting.delete(self.api, pod, grace_period_s)

    def pod_gone(self, pod: PodRef) -> bool:
        """See ``Cluster.pod_gone``."""
        return nodes.pod_gone(self.api, pod)

    def pdbs_for(self, pod: PodRef) -> list[str]:
        """See ``Cluster.pdbs_for``."""
        return [
            f"{b.namespace}/{b.name}"
            for b in nodes.list_pdbs(self.api, pod.namespace)
            if b.matches(pod)
        ]

    def healthz(self, node: str) -> bool:
        """See ``Cluster.healthz``."""
        return proxy.healthz(self.api, node)

    def configz(self, node: str) -> Mapping[str, Any]:
        """See ``Cluster.configz``."""
        return proxy.configz(self.api, node)

    def patch_labels(
        self, node: str, expect: Mapping[str, str | None], labels: Mapping[str, str | None]
    ) -> None:
        """See ``DeviceWorld.patch_labels``."""
        devices.patch_labels(self.api, node, expect, labels)

    def slice_devices(self, driver: str, node: str) -> list[str]:
        """See ``DeviceWorld.slice_devices``."""
        return devices.slice_devices(self.api, driver, node)

    def claims_on(self, driver: str, node: str) -> list[str]:
        """See ``DeviceWorld.claims_on``."""
        return devices.claims_on(self.api, driver, node)

    def prepared(self, driver: str, node: str) -> list[str]:
        """See ``DeviceWorld.prepared``: the claims the API server has reserved on the node
        (the kubelet's ``dra_manager_state`` is not read from here)."""
        return devices.reserved_on(self.api, driver, node)

    def assigned(self, resource: str, node: str) -> list[str]:
        """See ``DeviceWorld.assigned``: the pods bound to the node that request ``resource``
        from the device plugin (the device checkpoint is not read from here)."""
        return devices.assigned(self.api, resource, node)

    def claim_holders(self, driver: str, node: str) -> list[PodRef]:
        """See ``DeviceWorld.claim_holders``."""
        return devices.claim_holders(self.api, node)

    def dra_slices(self, node: str) -> Mapping[str, Mapping[str, int]]:
        """See ``Cluster.dra_slices`` (API discovery once per cluster object)."""
        if self._resource_versions is None:
            self._resource_versions = nodes.resource_api_versions(self.api)
        return nodes.dra_slices_on(self.api, self._resource_versions, node)

    def apply_objects(self, objects: Sequence[Mapping[str, Any]]) -> None:
        """See ``FreezeWorld.apply_objects``."""
        freeze.apply_objects(self.api, objects)

    def delete_object(self, kind: str, name: str) -> bool:
        """See ``FreezeWorld.delete_object``."""
        return freeze.delete_object(self.api, kind, name)

    def dry_run_create(self, obj: Mapping[str, Any]) -> str | None:
        """See ``FreezeWorld.dry_run_create``."""
        return freeze.dry_run_create(self.api, obj)
