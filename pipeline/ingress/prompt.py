"""RAG prompt text in the ingress, from the model's own chat template (fetched once from a replica).

The layout and the text of each piece are `engine.prompt`'s (`piece_text`, `question_text`): the
header opens the prompt (first chunk), each retrieved document is one piece tagged
`[source_id] title` in a stable order, and the question closes it (the `finish` piece), so a
replace keeps the longest common prefix. Replicas tokenize the text; the ingress never loads a
tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.prompt import question_text


@dataclass(frozen=True)
class PromptTemplate:
    header: str
    after_question: str

    def footer(self, question: str) -> str:
        return question_text(question, self.after_question)


async def fetch_template(handle) -> PromptTemplate:
    """Any replica serves the same model, so any one can answer."""
    parts = await handle.prompt_template.remote()
    return PromptTemplate(parts["header"], parts["after_question"])
