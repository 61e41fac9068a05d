"""A small stand-in for WebShop's Flask app, served by http.server in a thread.

Same URL scheme and the page structure the real templates have (buttons inside
forms, ``product-link`` anchors, option radios with ``data-url``, the score in
``#reward pre``), over a catalogue and goals loaded with the task's own loaders,
so `HttpSite` runs against real HTTP in the tests.
"""

from __future__ import annotations

import ast
import html
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agentrl.environments.tasks.webshop.catalogue import (
    Goal,
    Product,
    SearchIndex,
    load_catalogue,
    load_goals,
)
from agentrl.environments.tasks.webshop.reward import purchase_reward

_q = urllib.parse.quote


def _seg(value: object) -> str:
    return _q(str(value), safe="")


def _button(action: str, label: str) -> str:
    return (
        f'<form method="post" action="{html.escape(action)}">'
        f'<button type="submit" class="btn btn-primary">{html.escape(label)}</button></form>'
    )


def _doc(instruction: str, body: str) -> str:
    return (
        "<!DOCTYPE html><html><head><title>WebShop</title>"
        "<script>var x = 1;</script></head><body>"
        f'<div id="instruction-text"><h4>Instruction: {html.escape(instruction)}</h4></div>'
        f"{body}</body></html>"
    )


class FakeWebShop:
    """The fake app: start() serves on 127.0.0.1 (a free port), stop() shuts it down."""

    def __init__(self, builtin: tuple[int, int] = (25, 5)) -> None:
        """Serves the built-in shop of ``builtin`` (products and goals per type; the tests'
        small one by default)."""
        self.products: dict[str, Product] = load_catalogue(builtin=builtin)
        self.goals: list[Goal] = load_goals(None, self.products, builtin=builtin)
        self.index = SearchIndex(self.products)
        self.sessions: dict[str, Goal] = {}
        self.lock = threading.Lock()
        self.requests = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeWebShop:
        app = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                app.handle(self, b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                app.handle(self, self.rfile.read(length))

            def log_message(self, *args) -> None:
                pass  # quiet in tests

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --- routing ---------------------------------------------------------------------

    def handle(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        with self.lock:
            self.requests += 1
        parts = [urllib.parse.unquote(p) for p in request.path.split("?")[0].split("/") if p]
        try:
            status, page, location = self.route(parts, body)
        except (KeyError, IndexError, ValueError, SyntaxError) as exc:
            status, page, location = 404, f"not found: {exc}", None
        data = page.encode()
        request.send_response(status)
        if location:
            request.send_header("Location", location)
        request.send_header("Content-Type", "text/html; charset=utf-8")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def route(self, parts: list[str], body: bytes) -> tuple[int, str, str | None]:
        name = parts[0]
        if len(parts) == 1:
            return self.index_page(name, body)
        sid = parts[1]
        goal = self.sessions[sid]
        if name == "search_results":
            return 200, self.results_page(sid, goal, parts[2], int(parts[3])), None
        options = ast.literal_eval(parts[-1])
        if name == "item_page":
            return 200, self.item_page(sid, goal, parts[2], parts[3], parts[4], options), None
        if name == "item_sub_page":
            asin, kw, page, sub = parts[2:6]
            return 200, self.sub_page(sid, goal, asin, kw, page, sub, options), None
        if name == "done":
            return 200, self.done_page(goal, parts[2], options), None
        raise KeyError(name)

    def index_page(self, sid: str, body: bytes) -> tuple[int, str, str | None]:
        with self.lock:
            if sid not in self.sessions:
                self.sessions[sid] = self.goals[int(sid.split("_")[-1])]
            goal = self.sessions[sid]
        form = urllib.parse.parse_qs(body.decode())
        if "search_query" in form:
            keywords = form["search_query"][0].lower().split(" ")
            return 302, "", f"/search_results/{_seg(sid)}/{_seg(keywords)}/1"
        page = (
            f'<form id="form-buscar" method="post" action="/{_seg(sid)}">'
            '<input id="search_input" type="text" name="search_query" required/>'
            '<button class="btn btn-success" type="submit">Search</button></form>'
        )
        return 200, _doc(goal.instruction, "<h2>WebShop</h2>" + page), None

    def results_page(self, sid: str, goal: Goal, kw: str, page: int) -> str:
        keywords = ast.literal_eval(kw) if kw.startswith("[") else [kw]
        hits = self.index.search(" ".join(keywords))
        body = [f"<h1>Results</h1><p>Page {page} (Total results: {len(hits)})</p>"]
        body.append(_button(f"/{_seg(sid)}", "Back to Search"))
        if page > 1:
            body.append(_button(f"/search_results/{_seg(sid)}/{_seg(kw)}/{page - 1}", "< Prev"))
        if page * 10 < len(hits):
            body.append(_button(f"/search_results/{_seg(sid)}/{_seg(kw)}/{page + 1}", "Next >"))
        for asin in hits[(page - 1) * 10 : page * 10]:
            product = self.products[asin]
            href = f"/item_page/{_seg(sid)}/{asin}/{_seg(kw)}/{page}/{_seg({})}"
            body.append(
                f'<div class="grid-item"><h4><a class="product-link" href="{html.escape(href)}">'
                f"{asin}</a></h4><h4>{html.escape(product.title)}</h4>"
                f"<h5>{product.price_tag}</h5></div>"
            )
        return _doc(goal.instruction, "".join(body))

    def item_page(self, sid, goal, asin, kw, page, options) -> str:
        product = self.products[asin]
        base = f"/item_page/{_seg(sid)}/{asin}/{_seg(kw)}/{page}"
        body = [_button(f"/{_seg(sid)}", "Back to Search")]
        body.append(_button(f"/search_results/{_seg(sid)}/{_seg(kw)}/{page}", "< Back to Results"))
        for group, values in product.options.items():
            body.append(f"<h4>{html.escape(group)}</h4>")
            for i, value in enumerate(values):
                url = f"{base}/{_seg({**options, group: value})}"
                body.append(
                    f'<input type="radio" id="radio_{group}{i}" name="{html.escape(group)}" '
                    f'value="{html.escape(value)}" data-url="{html.escape(url)}">'
                    f'<label for="radio_{group}{i}">{html.escape(value)}</label>'
                )
        body.append(f"<h2>{html.escape(product.title)}</h2><h4>Price: {product.price_tag}</h4>")
        for sub in ("Description", "Features", "Reviews"):
            body.append(
                _button(
                    f"/item_sub_page/{_seg(sid)}/{asin}/{_seg(kw)}/{page}/{sub}/{_seg(options)}",
                    sub,
                )
            )
        body.append(_button(f"/done/{_seg(sid)}/{asin}/{_seg(options)}", "Buy Now"))
        return _doc(goal.instruction, "".join(body))

    def sub_page(self, sid, goal, asin, kw, page, sub, options) -> str:
        product = self.products[asin]
        back = f"/item_page/{_seg(sid)}/{asin}/{_seg(kw)}/{page}/{_seg(options)}"
        text = {
            "Description": [product.description],
            "Features": list(product.bullet_points),
            "Reviews": [f"{s:g} {t}" for s, t in product.reviews],
        }[sub]
        body = _button(f"/{_seg(sid)}", "Back to Search") + _button(back, "< Back to Item Page")
        body += "".join(f"<p>{html.escape(t)}</p>" for t in text)
        return _doc(goal.instruction, body)

    def done_page(self, goal: Goal, asin: str, options: dict) -> str:
        product = self.products[asin]
        reward = purchase_reward(product, goal, product.price, options).total
        return (
            "<html><head><title>WebShop</title></head><body>"
            "<h1>Thank you for shopping with us!</h1>"
            f'<div style="display:none"><h4 id="asin">asin<pre>{asin}</pre></h4></div>'
            f'<h3 id="reward">Your score (min 0.0, max 1.0)<pre>{reward}</pre></h3>'
            "</body></html>"
        )
