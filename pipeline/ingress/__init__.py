"""The HTTP ingress (runs in the ingress replicas): routes, flows, admission calls, no chunk text of retrievers."""
