"""RAG prompt assembly with the model's own chat template.

The prompt is cut into pieces that are tokenized separately and concatenated, so a session's
token sequence is a stable function of its documents: header, one piece per document (in the
order given; callers keep that order stable so a replace mostly changes the tail), and the
question last. Each document is tagged with its source id, which the answer can cite.

The text of a piece (`piece_text`) and of the question (`question_text`) is declared here once:
the pipeline's ingress builds the same text without a tokenizer, from `RagPrompt.template_parts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_SYSTEM = "You are a helpful assistant. Answer the question using the documents."
_PLACEHOLDER = "\x00STREAM2LLM\x00"


def piece_text(source_id: str, title: str, text: str) -> str:
    """One tagged document of the prompt (stable, so a replace keeps the common prefix)."""
    return f"[{source_id}] {title}\n{text.strip()}\n\n"


def question_text(question: str, after_question: str) -> str:
    """The last piece: the question, then the chat template's text after the user turn."""
    return f"Question: {question.strip()}{after_question}"


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
        return piece_text(doc.source_id, doc.title, doc.text)

    def footer_text(self, question: str) -> str:
        return question_text(question, self._after_user)

    def template_parts(self) -> dict:
        """What a remote caller needs to assemble the same text: header and the text after the
        question (the footer is `question_text(question, after_question)`)."""
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
        """Header plus documents: what a replace sends as the whole new context."""
        ids = self.header_ids()
        for doc in docs:
            ids.extend(self.doc_ids(doc))
        return ids

    def prompt_ids(self, docs: Sequence[ContextDoc], question: str) -> list[int]:
        """The one-shot prompt with exactly the tokens a streamed session ends with."""
        return self.context_ids(docs) + self.footer_ids(question)
