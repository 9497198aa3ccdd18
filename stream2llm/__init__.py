"""stream2llm: stream retrieved context into LLM engines while retrieval is still running."""

__version__ = "0.1.0"
