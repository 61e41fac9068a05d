"""Browsing a running WebShop web app over HTTP (``webshop`` task, ``server=URL``).

WebShop's Flask app (``web_agent_site/app.py``) serves HTML pages:

- ``GET /{session}``: the search page (a form posting ``search_query`` back to
  ``/{session}``, which redirects to the results);
- ``/search_results/{session}/{keywords}/{page}``, ``/item_page/{session}/{asin}/
  {keywords}/{page}/{options}``, ``/item_sub_page/.../{sub_page}/{options}``;
- ``/done/{session}/{asin}/{options}``: the purchase, with the score in
  ``<h3 id="reward">...<pre>0.75</pre></h3>``.

Buttons are forms posting to the next page's URL, products are ``<a
class="product-link">`` links, options are radio inputs whose ``data-url`` is
the item page with that option chosen. `HttpSite` follows those, and turns
each page into the same `Page` the in-process shop gives: the visible texts
(outside ``head``, ``script``, ``style``, ``title``) joined by `` [SEP] `` as
WebShop's text mode does, and its clickables as WebShop's ``get_available_actions``
lists them (buttons' and product links' texts lower-cased, then option values). A
search posts to the search form the first page showed, from whatever page, as
WebShop's text environment searches from any page. A session named
``<random>_fixed_<i>`` makes the app use its goal ``i``. Only the standard library is
used (urllib, html.parser).

Any failure to talk to the server (refused, timeout, HTTP error, a done page
without a score) is an `InfraError`: the environment broke, not the model.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
import uuid
from html.parser import HTMLParser

from agentrl.environments._protocol import InfraError
from agentrl.environments.tasks.webshop.site import InvalidAction, Page

__all__ = ["HttpSite", "parse_page"]

_HIDDEN = {"head", "script", "style", "title", "meta"}
_KINDS = {"search_results": "results", "item_page": "item", "done": "done"}


class _PageParser(HTMLParser):
    """Collects the visible texts, the clickables and the score of one WebShop page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self.targets: dict[str, tuple[str, str]] = {}
        """clickable -> (method, URL)."""
        self.buttons: list[str] = []
        """Every button's text, the search form's too (WebShop's ``.btn`` elements)."""
        self.links: list[str] = []
        """The product links' texts."""
        self.options: list[str] = []
        """The option radios' values."""
        self.search_form: str | None = None
        self.reward_text: str | None = None
        self._hidden = 0
        self._form: tuple[str, str] | None = None
        self._form_has_search = False
        self._button: list[str] | None = None
        self._link: str | None = None
        self._want_reward = False
        self._in_pre = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag in _HIDDEN:
            self._hidden += 1
        elif tag == "form":
            self._form = (a.get("method", "get").upper(), a.get("action", ""))
            self._form_has_search = False
        elif tag == "input" and a.get("id") == "search_input" and self._form:
            self._form_has_search = True
            self.search_form = self._form[1]
        elif tag == "input" and a.get("type") == "radio" and "value" in a:
            self.targets.setdefault(a["value"], ("GET", a.get("data-url", "")))
            self.options.append(a["value"])
        elif tag == "button" and self._form is not None:
            self._button = []
        elif tag == "a" and "product-link" in a.get("class", "").split():
            self._link = a.get("href", "")
        if a.get("id") == "reward":
            self._want_reward = True
        if tag == "pre":
            self._in_pre = True

    def handle_endtag(self, tag: str) -> None:
        if tag in _HIDDEN:
            self._hidden = max(0, self._hidden - 1)
        elif tag == "form":
            self._form = None
        elif tag == "button" and self._button is not None:
            name = " ".join(" ".join(self._button).split())
            if name:
                self.buttons.append(name)
            if name and self._form is not None and not self._form_has_search:
                self.targets.setdefault(name, self._form)
            self._button = None
        elif tag == "a":
            self._link = None
        elif tag == "pre":
            self._in_pre = False

    def handle_data(self, data: str) -> None:
        text = " ".join(data.split())
        if self._hidden or not text:
            return
        if self._want_reward and self._in_pre:
            self.reward_text, self._want_reward = text, False
        if self._button is not None:
            self._button.append(text)
        elif self._link is not None:
            self.targets.setdefault(text, ("GET", self._link))
            self.links.append(text)
        self.texts.append(text)


def parse_page(html: str, url: str) -> tuple[Page, dict[str, tuple[str, str]], str | None]:
    """A WebShop HTML page -> (Page, clickable -> (method, absolute URL), search form URL)."""
    parser = _PageParser()
    parser.feed(html)
    parser.close()
    path = [urllib.parse.unquote(p) for p in urllib.parse.urlsplit(url).path.split("/") if p]
    kind = _KINDS.get(path[0], "search") if path else "search"
    if path and path[0] == "item_sub_page":
        kind = path[5].lower() if len(path) > 5 else "description"
    if kind == "search" and parser.search_form is None:
        kind = "page"
    targets = {
        name: (method, urllib.parse.urljoin(url, target))
        for name, (method, target) in parser.targets.items()
    }
    reward = None
    if kind == "done":
        try:
            reward = float(parser.reward_text or "")
        except ValueError as exc:
            raise InfraError(f"webshop server: no score on the done page {url}") from exc
    search = urllib.parse.urljoin(url, parser.search_form) if parser.search_form else None
    shown = [b.lower() for b in parser.buttons] + [link.lower() for link in parser.links]
    page = Page(
        kind=kind,
        text=" [SEP] ".join(parser.texts),
        clickables=tuple(dict.fromkeys(shown + parser.options)),
        reward=reward,
    )
    return page, targets, search


class HttpSite:
    """One browsing session on a WebShop server (goal ``index``)."""

    def __init__(self, base_url: str, index: int, *, timeout: float = 30.0) -> None:
        self._base = base_url.rstrip("/")
        self._timeout = timeout
        self.session_id = f"{uuid.uuid4().hex}_fixed_{index}"
        self._opener = urllib.request.build_opener()
        self._targets: dict[str, tuple[str, str]] = {}
        self._search: str | None = None
        self.page = self._load("GET", f"{self._base}/{self.session_id}")

    def search(self, keywords: str) -> Page:
        if self._search is None:
            raise InvalidAction("the first page showed no search form")
        if not keywords:
            raise InvalidAction("no keywords to search")
        query = {"search_query": keywords}
        body = urllib.parse.urlencode(query, errors="replace").encode()  # lone surrogates
        self.page = self._load("POST", self._search, body)
        return self.page

    def click(self, name: str) -> Page:
        wanted = name.lower()
        by_lower = {k.lower(): v for k, v in self._targets.items()}
        target = by_lower.get(wanted)
        if target is None and wanted == "< prev":  # the app labels it "< Back to ..."
            target = next((v for k, v in by_lower.items() if k.startswith("< back to")), None)
        if target is None:
            raise InvalidAction(f"{name!r} is not a clickable on this page")
        method, url = target
        self.page = self._load(method, url, b"" if method == "POST" else None)
        return self.page

    def _load(self, method: str, url: str, body: bytes | None = None) -> Page:
        request = urllib.request.Request(url, data=body, method=method)
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                html = response.read().decode("utf-8", errors="replace")
                final = response.geturl()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise InfraError(f"webshop server: {method} {url} failed: {exc}") from exc
        page, self._targets, search = parse_page(html, final)
        self._search = self._search or search
        return page

    def close(self) -> None:
        """Drop the connection state (the app keeps its session until it restarts)."""
        self._targets = {}
        self._search = None
