"""The control plane: the central scheduler actor and its callers, session-affinity routing, autoscaling."""
