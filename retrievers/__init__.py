"""Retrievers: sources of context chunks emitted as streams (crawler, FAISS, trace replay)."""
