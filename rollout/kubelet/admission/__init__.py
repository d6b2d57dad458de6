"""A pure model of the kubelet's pod admission: CPU, Memory, device and Topology Managers.

Modules: ``topology`` (hints, merge, policies, options), ``cpus`` (the CPU accumulator,
``takeByTopology``), ``static`` (the CPU manager's static policy), ``memory`` (the Memory
Manager's Static policy), ``devices`` (device hints and choice), ``model`` (a node's admission
state; ``Node.admit``), ``facts`` (a ``Machine``/``Config`` from node facts and a kubelet config,
a ``Pod`` from an API object), ``node_preview`` (which pods a node admits or rejects under a
rendered config, over API objects). No I/O. What it covers and what it does not:
``docs/admission-model.md``; checked against the kubelet's own code by
``tests/unit/test_admission_diff.py``.
"""
