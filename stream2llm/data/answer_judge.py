"""A strict judge of short answers to grounded questions (pure: no model, no data files).

An answer is correct only when
1. it is not a refusal ("not mentioned in the document", "I don't know", ...);
2. it names an accepted answer *outside the question's own words*: a mention inside the subject's
   name does not count ("Bissau" inside "Guinea-Bissau", "São Tomé" inside "São Tomé and
   Príncipe"), and where the answer is spelled exactly as the subject (Singapore, Vatican City) the
   first such mention is taken as the echo of the question and only a further one counts;
3. it names no other candidate of the same kind (another capital, a country that is not a
   neighbour, a language that is not official): hedged answers and guessed lists do not score.
Matching is on whole words, ignoring case, accents and punctuation ("Port-au-Prince" = "port au
prince", "Chișinău" = "Chisinau"); overlapping names resolve to the longest ("Equatorial Guinea",
not "Guinea").
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

# Phrases a model uses to decline (matched on the normalized answer: no apostrophes, lower case);
# any of them makes the answer a refusal, whatever else it says.
REFUSAL = re.compile(
    r"\b(not (explicitly |directly |clearly )?(mentioned|stated|specified|provided|given|available|listed|known)"
    r"|(does|do|did)(nt| not) (mention|say|state|specify|provide|contain|include|list)"
    r"|(cannot|can not|cant|could not|couldnt|unable to) (be )?(determined?|answer|find|found|identify|tell|say|provide)"
    r"|no (information|mention|data)|i (dont|do not) know|not sure|unknown)\b")


def normalize(text: str) -> str:
    """Case-, accent- and punctuation-free form with single spaces: 'Chișinău!' -> 'chisinau'."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(re.sub(r"[^0-9a-z]+", " ", plain.replace("'", "").replace("’", "")).split())


def is_refusal(answer: str) -> bool:
    text = normalize(answer)
    return not text or REFUSAL.search(text) is not None


@dataclass(frozen=True)
class Verdict:
    correct: bool
    reason: str  # correct | refusal | other_candidate | echo_only (inside the question's words) | not_named
    named: tuple[str, ...] = ()  # accepted names found outside the question's words
    others: tuple[str, ...] = ()  # other candidates the answer names


def _spans(text: str, names: Iterable[str]) -> list[tuple[int, int, str]]:
    """Whole-word matches of `names` in normalized `text`, longest first where they overlap."""
    found = []
    for name in {n for n in names if n}:
        for m in re.finditer(rf"(?<![0-9a-z]){re.escape(name)}(?![0-9a-z])", text):
            found.append((m.start(), m.end(), name))
    found.sort(key=lambda s: (s[0], -(s[1] - s[0])))
    kept, end = [], -1
    for start, stop, name in found:
        if start >= end:
            kept.append((start, stop, name))
            end = stop
    return kept


def _classify(text: str, accepted: set[str], subject: set[str], others: set[str]) -> tuple[list, list, bool]:
    """Accepted names outside the subject's words, other candidates named, and whether the subject was."""
    named, wrong, echoed = [], [], False
    for _, _, name in _spans(text, accepted | subject | others):
        if name in subject and (name not in accepted or not echoed):
            echoed = True  # the question's own words (the first exact repeat of a same-named answer too)
        elif name in accepted:
            named.append(name)
        else:
            wrong.append(name)
    return named, wrong, echoed


def mentions(text: str, accepted: Iterable[str], subject: Iterable[str]) -> list[str]:
    """The `accepted` names that `text` names outside the `subject`'s own words (normalized)."""
    accepted_n, subject_n = {normalize(a) for a in accepted} - {""}, {normalize(s) for s in subject} - {""}
    return _classify(normalize(text), accepted_n, subject_n, set())[0]


def judge(answer: str, accepted: Iterable[str], subject: Iterable[str], candidates: Iterable[str] = ()) -> Verdict:
    """The verdict on `answer`: `accepted` are correct answers (all spellings), `subject` the names
    of what the question is about, `candidates` every answer of the question's kind (wrong ones too)."""
    accepted_n = {normalize(a) for a in accepted} - {""}
    subject_n = {normalize(s) for s in subject} - {""}
    others_n = {normalize(c) for c in candidates} - accepted_n - subject_n - {""}
    if not accepted_n:
        raise ValueError("a question needs at least one accepted answer")
    if is_refusal(answer):
        return Verdict(False, "refusal")
    text = normalize(answer)
    named, others, _ = _classify(text, accepted_n, subject_n, others_n)
    if others:
        return Verdict(False, "other_candidate", tuple(named), tuple(others))
    if named:
        return Verdict(True, "correct", tuple(named))
    # an accepted name that occurs only inside the question's words: the question echoed back
    return Verdict(False, "echo_only" if _spans(text, accepted_n) else "not_named")


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion (95% by default); None when n is 0."""
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..{n}, got {successes}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
