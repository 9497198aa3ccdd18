"""Where the control plane's actors live: the central scheduler and the session shards.

They hold state that must outlive any worker node, so they go where the operator says, by a custom
resource: a node that advertises `CONTROL_RESOURCE` (cluster.yaml gives it to the head node type;
a dedicated CPU node type may carry it instead) hosts them, each asking for a sliver of it, and Ray
places them there whatever that node's id (a node replaced by the launcher gets a new one). A
cluster with no such node (a local `ray.init`, a test cluster) keeps them on the head node by hard
node affinity: a soft one let Ray place them on a worker node, which was seen in the node-removal
drill to lose a session's record with its node.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

CONTROL_RESOURCE = "stream2llm_control"
HEAD_NODE_RESOURCE = "node:__internal_head__"  # Ray gives the head node this resource (amount 1)
_SLIVER = 0.001  # of CONTROL_RESOURCE per actor: any number of them fit on its node


def head_node_id() -> str | None:
    for node in ray.nodes():
        if node.get("Alive") and HEAD_NODE_RESOURCE in node.get("Resources", {}):
            return node["NodeID"]
    return None


def control_placement() -> dict:
    """Actor options (`resources` or `scheduling_strategy`) for a control-plane actor."""
    if ray.cluster_resources().get(CONTROL_RESOURCE, 0) > 0:
        return {"resources": {CONTROL_RESOURCE: _SLIVER}}
    head = head_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(head, soft=False) if head else "DEFAULT"}
