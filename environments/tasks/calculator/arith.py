"""A tiny safe arithmetic evaluator for the calculator task (a parser, never ``eval``)."""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["CalcError", "evaluate"]

_MAX_EXPRESSION = 200
_MAX_DEPTH = 32
_MAX_DIGITS = 30


class CalcError(ValueError):
    """Raised by :func:`evaluate` when an expression cannot be evaluated (shown to the model)."""


_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|(\S))")


def evaluate(expression: str) -> Fraction:
    """Exact value of an arithmetic expression: numbers, + - * /, unary signs, parentheses.

    Raises CalcError with a short reason on anything else, on division by
    zero, and on expressions longer than 200 characters or nested deeper than 32.
    """
    text = expression.replace("\u00d7", "*").replace("\u00f7", "/").strip().rstrip("=").strip()
    if not text:
        raise CalcError("empty expression")
    if len(text) > _MAX_EXPRESSION:
        raise CalcError(f"expression longer than {_MAX_EXPRESSION} characters")
    tokens: list[str | Fraction] = []
    for match in _TOKEN.finditer(text):
        number, symbol = match.groups()
        if number is not None:
            if len(number) > _MAX_DIGITS:
                raise CalcError("number too long")
            tokens.append(Fraction(number))
        elif symbol in "+-*/()":
            tokens.append(symbol)
        else:
            raise CalcError(f"unsupported character {symbol!r}")
    parser = _Parser(tokens)
    value = parser.expr(0)
    if parser.pos != len(tokens):
        raise CalcError(f"unexpected {tokens[parser.pos]!s}")
    return value


class _Parser:
    """Recursive descent: expr := term (+|- term)*; term := factor (*|/ factor)*;
    factor := (+|-) factor | number | ( expr )."""

    def __init__(self, tokens: list[str | Fraction]) -> None:
        self.tokens = tokens
        self.pos = 0

    def _peek(self) -> str | Fraction | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self._peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self._peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.factor(depth)
            if op == "*":
                value *= rhs
            elif rhs == 0:
                raise CalcError("division by zero")
            else:
                value /= rhs
        return value

    def factor(self, depth: int) -> Fraction:
        if depth > _MAX_DEPTH:
            raise CalcError("expression nested too deeply")
        token = self._peek()
        if token is None:
            raise CalcError("unexpected end of expression")
        self.pos += 1
        if isinstance(token, Fraction):
            return token
        if token in ("+", "-"):
            value = self.factor(depth + 1)
            return value if token == "+" else -value
        if token == "(":
            value = self.expr(depth + 1)
            if self._peek() != ")":
                raise CalcError("missing )")
            self.pos += 1
            return value
        raise CalcError(f"unexpected {token}")
