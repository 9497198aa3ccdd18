"""The engine replica (runs in the engine replicas): one streaming engine, the retriever-to-prefill data plane, answers kept for resume."""
