"""Text-match ranking for the local site's search endpoint.

Score = sum over query terms of idf * (title weight if the term is in the title, else a
saturated term frequency in the text), plus a large bonus when every title word is in the query.
The bonus makes "What is the capital of France?" rank the article "France" first.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from stream2llm.data.corpus import Document

STOP_WORDS = frozenset(
    "a an and are as at be by for from has have how in is it its of on or that the this to was "
    "were what when where which who why with does did do can".split()
)
_WORD = re.compile(r"\w+", re.UNICODE)
TITLE_WEIGHT = 3.0
FULL_TITLE_BONUS = 10.0


def words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


class SearchIndex:
    def __init__(self, documents: Sequence[Document]):
        self._docs = list(documents)
        self._titles = [set(words(d.title)) for d in self._docs]
        self._postings: dict[str, list[tuple[int, int]]] = {}
        for i, doc in enumerate(self._docs):
            for term, tf in Counter(words(doc.text) + words(doc.title)).items():
                self._postings.setdefault(term, []).append((i, tf))
        self._n = len(self._docs)

    def search(self, query: str, k: int) -> list[tuple[Document, float]]:
        terms = set(words(query))
        scores: dict[int, float] = {}
        for term in terms:
            postings = self._postings.get(term, ())
            if not postings:
                continue
            idf = math.log(1 + self._n / len(postings))
            for i, tf in postings:
                weight = TITLE_WEIGHT if term in self._titles[i] else tf / (tf + 1.2)
                scores[i] = scores.get(i, 0.0) + idf * weight
        for i in scores:
            if self._titles[i] and self._titles[i] <= terms:
                scores[i] += FULL_TITLE_BONUS
        ranked = sorted(scores.items(), key=lambda item: (-item[1], self._docs[item[0]].title))
        return [(self._docs[i], score) for i, score in ranked[:k]]
