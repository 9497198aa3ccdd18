"""Running the application on this machine and talking to it: `stream2llm serve`, the local app, the demo, the /v1/rag client."""
