"""Preflight's pod reads do not grow with the Nodes outside the inventory: one paginated listing
of the cluster's pods (``limit`` / ``continue``), never a request per Node. Counted against a
loopback stand-in of the API server (``tests/unit/fake_apiserver.py``) through the tool's own
HTTP client; the lab's preflight tests run the same code against kube-apiserver."""

from __future__ import annotations

import math

import pytest

from rollout.change.preflight.checking import ClusterReader
from rollout.kube import nodes as kn
from rollout.models import Requests
from tests.unit.fake_apiserver import Fleet, api_for, node_name, serving

NODES = 400
PODS = 5


def test_one_paginated_listing_however_many_nodes() -> None:
    fleet = Fleet(NODES, PODS)
    with serving(fleet) as url:
        listing = kn.pods_by_node(api_for(url), keep={node_name(1), node_name(2)}, page=100)
    refs, objects = listing.refs, listing.objects
    live = NODES * PODS
    served = len(fleet.pods(kn.LIVE))  # the live pods and one not bound to a Node yet
    assert served == live + 1
    assert fleet.requests["pods, a page"] == math.ceil(served / 100)  # 21 requests, not 400
    assert fleet.requests["pods on a node"] == 0
    # every node's requests summed (100m and 64Mi a pod), the finished and the unbound left out
    assert len(listing.used) == NODES
    assert all(u == Requests(100 * PODS, PODS * 64 << 20, {}) for u in listing.used.values())
    # records and whole objects only where asked
    assert set(refs) == set(objects) == {node_name(1), node_name(2)}
    assert all(len(v) == PODS for v in refs.values())
    assert [p.name for p in refs[node_name(1)]] == [
        p["metadata"]["name"] for p in fleet.by_node[node_name(1)]
    ]
    stamps = [p["metadata"]["creationTimestamp"] for p in objects[node_name(1)]]
    assert stamps == sorted(stamps)  # oldest first, what the admission preview admits in order


def test_prefetch_sends_no_request_per_node() -> None:
    """Everything preflight reads ahead of the facts: a fixed number of requests (version,
    discovery, Nodes, PDBs, controllers, the pod pages), none per Node."""
    counts = {}
    for n in (50, 500):
        fleet = Fleet(n, 2)
        with serving(fleet) as url:
            reader = ClusterReader(api_for(url), {node_name(0)})
            reader.prefetch()
            listing = reader.pod_listing()
        assert len(listing.used) == n and set(listing.objects) == {node_name(0)}
        assert fleet.requests["pods on a node"] == 0
        counts[n] = sum(fleet.requests.values()) - fleet.requests["pods, a page"]
        assert fleet.requests["pods, a page"] == math.ceil(len(fleet.pods(kn.LIVE)) / kn.POD_PAGE)
    assert counts[50] == counts[500]  # the other requests do not grow with the Nodes either


def test_an_expired_continue_token_lists_again_from_the_start() -> None:
    fleet = Fleet(30, 10)
    fleet.expire_once = {"200"}  # the third page's token: compacted away
    with serving(fleet) as url:
        used = kn.pods_by_node(api_for(url), keep=set(), page=100).used
    assert sum(u.cpu_millis for u in used.values()) == 300 * 100  # no page twice, none missing
    # 301 served (one unbound) in pages of 100: two pages, the 410, then all four again
    assert fleet.requests["pods, a page"] == 2 + 1 + 4


def test_a_token_that_keeps_expiring_is_an_error_naming_the_listing() -> None:
    from rollout.errors import ExternalError

    class Sticky(set[str]):
        def discard(self, _x: str) -> None:  # never forgets the token: 410 every time
            return None

    fleet = Fleet(30, 10)
    fleet.expire_once = Sticky({"100"})
    with serving(fleet) as url, pytest.raises(ExternalError, match="continue token expired"):
        kn.pods_by_node(api_for(url), keep=set(), page=100)
    assert fleet.requests["pods, a page"] == 3 * 2  # three tries of a page and its 410


def test_pod_requests_are_summed_as_quantities() -> None:
    """The records the capacity check sums: requests over containers, as the API writes them
    (the parse is cached per distinct value; a value that does not parse counts 0)."""
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                {"resources": {"requests": {"cpu": "1.5", "memory": "1G"}}},
                {"resources": {"requests": {"cpu": "lots"}}},
            ],
        },
    }
    ref = kn.to_pod_ref(pod)
    assert ref.cpu_millis == 100 + 1500
    assert ref.memory_bytes == 64 * 2**20 + 10**9
    assert kn.to_pod_ref(pod) == ref  # the same again, from the cache


def test_the_listings_ask_for_gzip_and_read_it_back() -> None:
    """The listings are read compressed (``Accept-Encoding: gzip``, as client-go asks): the
    stand-in compresses what kube-apiserver compresses (over 128 KiB) and the client inflates
    it as it reads; the lab's kwok test checks the real API server's answer."""
    fleet = Fleet(NODES, PODS)
    with serving(fleet) as url:
        api = api_for(url)
        infos, whole = kn.nodes_listed(api, keep={node_name(3)})
        listing = kn.pods_by_node(api, keep={node_name(3)}, page=NODES * PODS)
    assert fleet.compressed["/api/v1/nodes"] == 1
    assert fleet.compressed["/api/v1/pods"] == 1  # one page of every pod: over 128 KiB
    assert sorted(infos) == sorted(n["metadata"]["name"] for n in fleet.nodes)
    assert whole == {node_name(3): fleet.nodes[3]}
    assert len(listing.used) == NODES and len(listing.objects[node_name(3)]) == PODS
