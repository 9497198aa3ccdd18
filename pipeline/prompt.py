"""RAG prompt pieces as text, rendered in the ingress without loading a tokenizer.

The layout is `engine.prompt.RagPrompt`'s with SmolLM2's chat template (ChatML): the header opens
the prompt (first chunk), each retrieved document is one piece tagged `[source_id] title` in a
stable order, and the question closes it (the `finish` piece), so a replace keeps the longest
common prefix. Replicas tokenize the text.
"""

from __future__ import annotations

from pipeline.schemas import ChatMessage

SYSTEM = "You are a helpful assistant. Answer the question using the documents."


def rag_header() -> str:
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nDocuments:\n\n"


def rag_footer(question: str) -> str:
    return f"Question: {question.strip()}<|im_end|>\n<|im_start|>assistant\n"


def chat_prompt(messages: list[ChatMessage]) -> str:
    """ChatML, the template of SmolLM2 (the default model)."""
    turns = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"
