"""stream2llm on Ray Serve: config, app builder, ingress, engine replicas, central scheduler wiring."""
