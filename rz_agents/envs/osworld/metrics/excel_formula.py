"""A small evaluator for spreadsheet formulas, enough for conditional-formatting conditions.

``compare_table``'s ``style`` rule must know which cells a conditional format paints (e.g.
``=A2=MAX($A$2:$A$20)`` or ``=WEEKDAY(B3,2)>5``). ``evaluate(formula, cell_value, origin, at)``
evaluates ``formula`` for the cell at ``at`` (row, column) of a range whose top-left cell is
``origin``: relative references shift with the cell, ``$``-anchored parts do not, as in Excel.

Supported: numbers, strings, ``TRUE``/``FALSE``, references and ranges (same sheet), operators
``+ - * / ^ & % = <> < > <= >=`` with Excel's precedence, and the functions in ``FUNCTIONS``.
Anything else raises ``FormulaError`` (the metric then scores 0 and says why).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable
from typing import Any

EXCEL_EPOCH = dt.datetime(1899, 12, 30)

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)
    | (?P<str>"(?:[^"]|"")*")
    | (?P<ref>(?:(?:'[^']+'|[A-Za-z0-9_.]+)!)?\$?[A-Za-z]{1,3}\$?\d+(?::\$?[A-Za-z]{1,3}\$?\d+)?)(?![A-Za-z0-9_(])
    | (?P<func>[A-Za-z_][A-Za-z0-9_.]*)\s*\(
    | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
    | (?P<op><>|<=|>=|[-+*/^&%=<>(),;])
    )""",  # noqa: E501 (one token pattern per line)
    re.X,
)
_REF = re.compile(r"(\$?)([A-Za-z]{1,3})(\$?)(\d+)")


class FormulaError(ValueError):
    """The formula uses something this evaluator does not support, or an Excel error (#VALUE!)."""


def to_number(v: Any) -> float:
    """Excel's number coercion: empty -> 0, bools -> 0/1, dates -> serial days, numeric text -> number."""
    if v is None or v == "":
        return 0.0
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, dt.datetime):
        return (v - EXCEL_EPOCH).total_seconds() / 86400.0
    if isinstance(v, dt.date):
        return float((dt.datetime(v.year, v.month, v.day) - EXCEL_EPOCH).days)
    if isinstance(v, dt.time):
        return (v.hour * 3600 + v.minute * 60 + v.second) / 86400.0
    try:
        return float(str(v))
    except ValueError:
        raise FormulaError(f"#VALUE!: {v!r} is not a number") from None


def to_text(v: Any) -> str:
    """Excel's text coercion."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def to_date(v: Any) -> dt.datetime:
    """A date from a cell value (a datetime, or an Excel serial number)."""
    if isinstance(v, dt.datetime):
        return v
    if isinstance(v, dt.date):
        return dt.datetime(v.year, v.month, v.day)
    return EXCEL_EPOCH + dt.timedelta(days=to_number(v))


def _rank(v: Any) -> int:
    # Excel orders numbers < text < logicals
    if isinstance(v, bool):
        return 2
    return 1 if isinstance(v, str) else 0


def compare(op: str, a: Any, b: Any) -> bool:
    """Excel comparison: empty cells take the other side's kind; text is compared case-insensitively."""
    if a is None:
        a = "" if isinstance(b, str) else (False if isinstance(b, bool) else 0.0)
    if b is None:
        b = "" if isinstance(a, str) else (False if isinstance(a, bool) else 0.0)
    if not isinstance(a, (str, bool)):
        a = to_number(a)
    if not isinstance(b, (str, bool)):
        b = to_number(b)
    if _rank(a) != _rank(b):
        x, y = _rank(a), _rank(b)
    elif isinstance(a, str):
        x, y = a.casefold(), b.casefold()
    else:
        x, y = a, b
    return {"=": x == y, "<>": x != y, "<": x < y, ">": x > y, "<=": x <= y, ">=": x >= y}[op]


def _flatten(args: list[Any]) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out.extend(_flatten(a) if isinstance(a, list) else [a])
    return out


def _numbers(args: list[Any]) -> list[float]:
    # Like Excel's SUM/MAX over ranges: text and empty cells in ranges are skipped.
    return [to_number(v) for v in _flatten(args) if v is not None and not isinstance(v, str)]


def _weekday(value: Any, kind: Any = 1) -> float:
    d = to_date(value).weekday()  # Monday = 0
    kind = int(to_number(kind))
    if kind == 1:
        return float((d + 1) % 7 + 1)  # Sunday = 1 .. Saturday = 7
    if kind == 2:
        return float(d + 1)  # Monday = 1 .. Sunday = 7
    if kind == 3:
        return float(d)  # Monday = 0 .. Sunday = 6
    raise FormulaError(f"WEEKDAY type {kind} not supported")


def _round(x: Any, digits: Any = 0) -> float:
    q = 10 ** int(to_number(digits))
    v = to_number(x) * q
    return math.copysign(math.floor(abs(v) + 0.5), v) / q  # half away from zero, as Excel


def _average(*a: Any) -> float:
    nums = _numbers(list(a))
    if not nums:
        raise FormulaError("#DIV/0!: AVERAGE of no numbers")
    return sum(nums) / len(nums)


def _kth(values: list[Any], k: Any, largest: bool) -> float:
    nums = sorted(_numbers([values]), reverse=largest)
    i = int(to_number(k))
    if not 1 <= i <= len(nums):
        raise FormulaError("#NUM!: k out of range")
    return nums[i - 1]


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "SUM": lambda *a: sum(_numbers(list(a))),
    "MAX": lambda *a: max(_numbers(list(a)), default=0.0),
    "MIN": lambda *a: min(_numbers(list(a)), default=0.0),
    "AVERAGE": _average,
    "COUNT": lambda *a: float(len(_numbers(list(a)))),
    "COUNTA": lambda *a: float(sum(v is not None and v != "" for v in _flatten(list(a)))),
    "LARGE": lambda r, k: _kth(r, k, True),
    "SMALL": lambda r, k: _kth(r, k, False),
    "AND": lambda *a: all(bool(to_number(v)) if not isinstance(v, bool) else v for v in _flatten(list(a))),
    "OR": lambda *a: any(bool(to_number(v)) if not isinstance(v, bool) else v for v in _flatten(list(a))),
    "NOT": lambda v: not (v if isinstance(v, bool) else bool(to_number(v))),
    "IF": lambda c, a=True, b=False: a if (c if isinstance(c, bool) else bool(to_number(c))) else b,
    "ABS": lambda v: abs(to_number(v)),
    "INT": lambda v: float(math.floor(to_number(v))),
    "ROUND": _round,
    "MOD": lambda a, b: to_number(a) - to_number(b) * math.floor(to_number(a) / to_number(b)),
    "LEN": lambda v: float(len(to_text(v))),
    "LEFT": lambda v, n=1: to_text(v)[: int(to_number(n))],
    "RIGHT": lambda v, n=1: to_text(v)[len(to_text(v)) - int(to_number(n)) :] if int(to_number(n)) else "",
    "MID": lambda v, s, n: to_text(v)[int(to_number(s)) - 1 : int(to_number(s)) - 1 + int(to_number(n))],
    "UPPER": lambda v: to_text(v).upper(),
    "LOWER": lambda v: to_text(v).lower(),
    "TRIM": lambda v: " ".join(to_text(v).split()),
    "ISBLANK": lambda v: v is None,
    "ISNUMBER": lambda v: isinstance(v, (int, float, dt.date, dt.time)) and not isinstance(v, bool),
    "ISTEXT": lambda v: isinstance(v, str),
    "ISEVEN": lambda v: int(to_number(v)) % 2 == 0,
    "ISODD": lambda v: int(to_number(v)) % 2 == 1,
    "WEEKDAY": _weekday,
    "DAY": lambda v: float(to_date(v).day),
    "MONTH": lambda v: float(to_date(v).month),
    "YEAR": lambda v: float(to_date(v).year),
}

CellReader = Callable[[int, int], Any]  # (row, column) -> value


class _Parser:
    """Recursive descent over the tokens; evaluates as it parses (formulas are tiny)."""

    def __init__(self, formula: str, read: CellReader, shift: tuple[int, int]) -> None:
        self.tokens = self._tokenize(formula)
        self.pos = 0
        self.read = read
        self.shift = shift

    @staticmethod
    def _tokenize(formula: str) -> list[tuple[str, str]]:
        out, pos, text = [], 0, formula.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise FormulaError(f"cannot read formula at {text[pos:]!r}")
            kind = m.lastgroup or ""
            out.append((kind, m.group(kind)))
            pos = m.end()
        return out

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise FormulaError(f"expected {value or 'more'} in formula")
        self.pos += 1
        return tok

    def parse(self) -> Any:
        value = self.comparison()
        if self.peek() is not None:
            raise FormulaError(f"unexpected {self.peek()[1]!r} in formula")
        return value

    def comparison(self) -> Any:
        left = self.concat()
        while (tok := self.peek()) and tok[0] == "op" and tok[1] in ("=", "<>", "<", ">", "<=", ">="):
            self.take()
            left = compare(tok[1], left, self.concat())
        return left

    def concat(self) -> Any:
        left = self.additive()
        while (tok := self.peek()) and tok[1] == "&":
            self.take()
            left = to_text(left) + to_text(self.additive())
        return left

    def additive(self) -> Any:
        left = self.term()
        while (tok := self.peek()) and tok[0] == "op" and tok[1] in "+-":
            self.take()
            right = self.term()
            left = to_number(left) + to_number(right) if tok[1] == "+" else to_number(left) - to_number(right)
        return left

    def term(self) -> Any:
        left = self.power()
        while (tok := self.peek()) and tok[0] == "op" and tok[1] in "*/":
            self.take()
            right = to_number(self.power())
            if tok[1] == "/" and right == 0:
                raise FormulaError("#DIV/0!")
            left = to_number(left) * right if tok[1] == "*" else to_number(left) / right
        return left

    def power(self) -> Any:
        left = self.unary()
        while (tok := self.peek()) and tok[1] == "^":
            self.take()
            left = to_number(left) ** to_number(self.unary())
        return left

    def unary(self) -> Any:
        tok = self.peek()
        if tok and tok[0] == "op" and tok[1] in "+-":
            self.take()
            value = to_number(self.unary())
            return -value if tok[1] == "-" else value
        value = self.atom()
        while (tok := self.peek()) and tok[1] == "%":
            self.take()
            value = to_number(value) / 100
        return value

    def atom(self) -> Any:
        kind, text = self.take()
        if kind == "num":
            return float(text)
        if kind == "str":
            return text[1:-1].replace('""', '"')
        if kind == "ref":
            return self.reference(text)
        if kind == "name":
            if text.upper() in ("TRUE", "FALSE"):
                return text.upper() == "TRUE"
            raise FormulaError(f"named ranges are not supported: {text}")
        if kind == "func":
            return self.call(text.upper())
        if text == "(":
            value = self.comparison()
            self.take(")")
            return value
        raise FormulaError(f"unexpected {text!r} in formula")

    def call(self, name: str) -> Any:
        name = name.removeprefix("_XLFN.")
        fn = FUNCTIONS.get(name)
        if fn is None:
            raise FormulaError(f"function {name} is not supported")
        args: list[Any] = []
        if self.peek() and self.peek()[1] == ")":
            self.take()
        else:
            while True:
                args.append(self.comparison())
                sep = self.take()
                if sep[1] == ")":
                    break
                if sep[1] not in (",", ";"):
                    raise FormulaError(f"unexpected {sep[1]!r} in the arguments of {name}")
        try:
            return fn(*args)
        except TypeError as exc:
            raise FormulaError(f"{name}: wrong arguments ({exc})") from exc

    def _cell(self, text: str) -> tuple[int, int]:
        from openpyxl.utils import column_index_from_string

        m = _REF.fullmatch(text)
        assert m is not None
        row, col = int(m.group(4)), column_index_from_string(m.group(2).upper())
        if not m.group(1):
            col += self.shift[1]
        if not m.group(3):
            row += self.shift[0]
        return row, col

    def reference(self, text: str) -> Any:
        if "!" in text:
            text = text.split("!", 1)[1]  # the sheet is the formatted one: other sheets are not supported
        if ":" in text:
            (r1, c1), (r2, c2) = (self._cell(p) for p in text.split(":"))
            return [
                self.read(r, c)
                for r in range(min(r1, r2), max(r1, r2) + 1)
                for c in range(min(c1, c2), max(c1, c2) + 1)
            ]
        return self.read(*self._cell(text))


def evaluate(
    formula: str, read: CellReader, origin: tuple[int, int] = (1, 1), at: tuple[int, int] | None = None
) -> Any:
    """The value of ``formula`` for the cell ``at`` (row, col) of a range starting at ``origin``."""
    at = at or origin
    shift = (at[0] - origin[0], at[1] - origin[1])
    return _Parser(formula.lstrip("="), read, shift).parse()


def truthy(value: Any) -> bool:
    """A condition's result as a boolean (numbers: non-zero; text: an error in Excel, False here)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) or value is None:
        return False
    return to_number(value) != 0
