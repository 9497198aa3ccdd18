"""HTML for the local site: an article wrapped in the boilerplate a real wiki page carries
(navigation, sidebar, cookie banner, footer), so main-text extraction has work to do."""

from __future__ import annotations

import html
from collections.abc import Sequence

from stream2llm.data.corpus import WIKI_ATTRIBUTION, Document

SITE_NAME = "Stream2LLM Local Wiki"
NAV_LINKS = ("Main page", "Contents", "Current events", "Random article", "About", "Contact", "Donate")


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def article_page(doc: Document, related: Sequence[Document], charset: str = "utf-8") -> str:
    paragraphs = "\n".join(f"<p>{_esc(p)}</p>" for p in doc.text.split("\n") if p.strip())
    return _layout(doc.title, f"""
<main id="content"><article>
<h1 class="firstHeading">{_esc(doc.title)}</h1>
<div class="shortdescription">From {SITE_NAME}, the free encyclopedia</div>
<div id="bodyContent">
{paragraphs}
</div>
</article></main>""", related, charset)


def home_page(docs: Sequence[Document]) -> str:
    items = "\n".join(f'<li><a href="/wiki/{d.doc_id}">{_esc(d.title)}</a></li>' for d in docs)
    return _layout(SITE_NAME, f"<main><h1>{SITE_NAME}</h1><ul>{items}</ul></main>", (), "utf-8")


def boilerplate_only_page() -> str:
    return _layout("Nothing here", "<main></main>", (), "utf-8")


def _layout(title: str, body: str, related: Sequence[Document], charset: str) -> str:
    nav = " | ".join(f'<a href="/">{_esc(name)}</a>' for name in NAV_LINKS)
    side = "\n".join(f'<li><a href="/wiki/{d.doc_id}">{_esc(d.title)}</a></li>' for d in related)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="{charset}"><title>{_esc(title)} - {SITE_NAME}</title>
<meta name="description" content="{_esc(title)}"></head>
<body>
<div id="cookie-banner">We use cookies to improve your experience. <button>Accept all</button></div>
<header><nav class="top-nav">{nav}</nav>
<form action="/search"><input name="q" placeholder="Search {SITE_NAME}"><button>Search</button></form>
</header>
<aside id="sidebar"><h2>Related articles</h2><ul>{side}</ul>
<h2>Tools</h2><ul><li>What links here</li><li>Related changes</li><li>Printable version</li></ul></aside>
{body}
<footer><p>{_esc(WIKI_ATTRIBUTION)}</p>
<p>Privacy policy · About {SITE_NAME} · Disclaimers · Terms of Use</p></footer>
</body></html>"""
