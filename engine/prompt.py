"""RAG prompt assembly with the model's own chat template.

The prompt is cut into pieces that are tokenized separately and concatenated, so a session's
token sequence is a stable function of its documents: header, one piece per document (in the
order given; callers keep that order stable so an update mostly changes the tail), and the
question last. Each document is tagged with its source id, which the answer can cite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_SYSTEM = "You are a helpful assistant. Answer the question using the documents."
_PLACEHOLDER = "\x00STREAM2LLM\x00"


@dataclass(frozen=True)
class ContextDoc:
    source_id: str
    title: str
    text: str


class RagPrompt:
    def __init__(self, tokenizer, system: str = DEFAULT_SYSTEM):
        self._tokenizer = tokenizer
        messages = [{"role": "system", "content": system}, {"role": "user", "content": _PLACEHOLDER}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        self._before_user, self._after_user = rendered.split(_PLACEHOLDER)
        self._doc_cache: dict[ContextDoc, list[int]] = {}

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def header_text(self) -> str:
        return self._before_user + "Documents:\n\n"

    @staticmethod
    def doc_text(doc: ContextDoc) -> str:
        return f"[{doc.source_id}] {doc.title}\n{doc.text}\n\n"

    def footer_text(self, question: str) -> str:
        return f"Question: {question}" + self._after_user

    def template_parts(self) -> dict:
        """What a remote caller needs to assemble the same text: header and the text after the
        question (footer = "Question: " + question + after_question)."""
        return {"header": self.header_text(), "after_question": self._after_user}

    def header_ids(self) -> list[int]:
        return self._encode(self.header_text())

    def doc_ids(self, doc: ContextDoc) -> list[int]:
        if doc not in self._doc_cache:
            self._doc_cache[doc] = self._encode(self.doc_text(doc))
        return self._doc_cache[doc]

    def footer_ids(self, question: str) -> list[int]:
        return self._encode(self.footer_text(question))

    def context_ids(self, docs: Sequence[ContextDoc]) -> list[int]:
        """Header plus documents: what an update sends as the whole new context."""
        ids = self.header_ids()
        for doc in docs:
            ids.extend(self.doc_ids(doc))
        return ids

    def prompt_ids(self, docs: Sequence[ContextDoc], question: str) -> list[int]:
        """The one-shot prompt with exactly the tokens a streamed session ends with."""
        return self.context_ids(docs) + self.footer_ids(question)
