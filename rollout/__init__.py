"""rollout: change the kubelet's CPU / Topology / Memory manager configuration on nodes, safely.

The package is split so that decisions are pure functions over plain data (``kubelet``,
``change/plan``, ``gate/analysis``) and every process boundary sits behind one subpackage
(``kube`` for the Kubernetes API, ``ansible`` for nodes, ``lab`` for the local test cluster).
"""

__version__ = "0.1.0.dev0"
