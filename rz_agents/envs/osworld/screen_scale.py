"""Screenshots at the model's image size, and the agent's coordinates mapped back to the screen.

A vision-language policy sees the desktop resized to ``image_size`` (e.g. 1280x720 for a
1920x1080 screen), so the pixel positions in its pyautogui code are in the image's pixels. Before
the code runs, ``scale_pyautogui_code`` rewrites every coordinate argument of the pyautogui mouse
calls to screen pixels (``x * screen_w / image_w``, ``y * screen_h / image_h``, rounded), and
``scale_tree_table`` writes the accessibility tree's positions and sizes in image pixels, so both
observations and actions live in one coordinate system: the image's.

The rewrite works on the code's syntax tree (``ast``): a literal is replaced by its scaled value
(``pyautogui.click(640, 360)`` -> ``pyautogui.click(960, 540)``, readable in the action history);
any other expression is wrapped in a helper defined ahead of the code (``_rz_scale(expr, 1.5)``;
``_rz_pair`` for a value that may be an ``(x, y)`` pair), which keeps ``None`` as pyautogui's
"where the pointer is". Calls reached some other way (an alias
of pyautogui, ``getattr``) are not rewritten; the prompt asks for ``pyautogui.<call>`` as written.
"""

from __future__ import annotations

import ast
import io
from dataclasses import dataclass
from typing import Any

# pyautogui functions whose first two positional arguments (or x=, y=) are absolute positions
ABSOLUTE_XY = (
    "click",
    "doubleClick",
    "tripleClick",
    "rightClick",
    "middleClick",
    "leftClick",
    "moveTo",
    "dragTo",
    "mouseDown",
    "mouseUp",
    "scroll",
    "hscroll",
    "vscroll",
)
# ... whose first two positional arguments (or xOffset=, yOffset=) are offsets in pixels
RELATIVE_XY = ("move", "moveRel", "drag", "dragRel")


@dataclass(frozen=True)
class ScreenScale:
    """The screen's size, the image's size, and the factors from image pixels to screen pixels."""

    screen_w: int
    screen_h: int
    image_w: int
    image_h: int

    @property
    def sx(self) -> float:
        """Screen pixels per image pixel, horizontally."""
        return self.screen_w / self.image_w

    @property
    def sy(self) -> float:
        """Screen pixels per image pixel, vertically."""
        return self.screen_h / self.image_h

    @property
    def identity(self) -> bool:
        """True when the image is the screen's size (nothing to rewrite)."""
        return (self.screen_w, self.screen_h) == (self.image_w, self.image_h)

    def to_screen(self, x: float, y: float) -> tuple[int, int]:
        """An image-pixel position as the screen pixel pyautogui will get (rounded to the nearest)."""
        return round(x * self.sx), round(y * self.sy)

    def to_image(self, x: float, y: float) -> tuple[int, int]:
        """A screen-pixel position in image pixels (rounded to the nearest)."""
        return round(x / self.sx), round(y / self.sy)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``info`` (sizes and both factors)."""
        return {
            "screen_size": [self.screen_w, self.screen_h],
            "image_size": [self.image_w, self.image_h],
            "sx": self.sx,
            "sy": self.sy,
        }


def check_image_size(image_size: Any) -> tuple[int, int] | None:
    """``image_size`` as ``(width, height)`` of positive ints, or None; ValueError naming the bad value."""
    if image_size is None:
        return None
    ok = (
        isinstance(image_size, (list, tuple))
        and len(image_size) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in image_size)
    )
    if not ok:
        raise ValueError(
            f"image_size must be [width, height] in pixels (positive ints) or null, got {image_size!r}"
        )
    return int(image_size[0]), int(image_size[1])


def resize_screenshot(png: bytes, image_size: tuple[int, int] | None):
    """The screenshot as an RGB ``PIL.Image`` at ``image_size`` (the screen's size when None), and its
    ``ScreenScale``. Resampled with Lanczos (a screenshot's text stays legible when shrunk)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png))
    img.load()
    img = img.convert("RGB")
    w, h = img.size
    iw, ih = image_size or (w, h)
    if (iw, ih) != (w, h):
        img = img.resize((iw, ih), Image.Resampling.LANCZOS)
    return img, ScreenScale(w, h, iw, ih)


# Defined ahead of rewritten code that scales a value only known when it runs (a variable, a call).
HELPERS = """def _rz_scale(v, f):
    return None if v is None else round(v * f)
def _rz_pair(v, fx, fy):
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return (_rz_scale(v[0], fx), _rz_scale(v[1], fy))
    return _rz_scale(v, fx)
"""


def _number(node: ast.expr) -> float | None:
    """The value of a number literal (``3``, ``-2.5``), else None."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        sign = -1 if isinstance(node.op, ast.USub) else 1
        node = node.operand
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return sign * node.value
    return None


def _call(name: str, *args: ast.expr) -> ast.expr:
    return ast.Call(func=ast.Name(name, ast.Load()), args=list(args), keywords=[])


class _Rewriter(ast.NodeTransformer):
    def __init__(self, scale: ScreenScale) -> None:
        self.scale = scale
        self.calls = 0
        self.needs_helpers = False

    def scaled(self, node: ast.expr, factor: float) -> ast.expr:
        """``node`` times ``factor``, rounded: folded for a literal, a helper call otherwise."""
        if isinstance(node, ast.Constant) and node.value is None:
            return node  # None: pyautogui's "where the pointer is"
        value = _number(node)
        if value is not None:
            return ast.Constant(round(value * factor))
        self.needs_helpers = True
        return _call("_rz_scale", node, ast.Constant(factor))

    def position(self, node: ast.expr) -> ast.expr:
        """One argument where x goes: a literal ``(x, y)`` pair, x alone, or a value that may be either."""
        sx, sy = self.scale.sx, self.scale.sy
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == 2:
            return type(node)(
                elts=[self.scaled(node.elts[0], sx), self.scaled(node.elts[1], sy)], ctx=ast.Load()
            )
        if _number(node) is not None or (isinstance(node, ast.Constant) and node.value is None):
            return self.scaled(node, sx)
        self.needs_helpers = True
        return _call("_rz_pair", node, ast.Constant(sx), ast.Constant(sy))

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "pyautogui"):
            return node
        if f.attr in ABSOLUTE_XY:
            names = ("x", "y")
        elif f.attr in RELATIVE_XY:
            names = ("xOffset", "yOffset")
        else:
            return node
        # scroll(clicks, x, y): its position is the 2nd and 3rd positional arguments
        first = 1 if f.attr in ("scroll", "hscroll", "vscroll") else 0
        args = list(node.args)
        factors = (self.scale.sx, self.scale.sy)
        if len(args) == first + 1:  # one argument where x goes: a (x, y) pair, or x alone
            args[first] = self.position(args[first])
        else:
            for k in range(first, min(first + 2, len(args))):
                args[k] = self.scaled(args[k], factors[k - first])
        keywords = [
            ast.keyword(kw.arg, self.scaled(kw.value, factors[names.index(kw.arg)]))
            if kw.arg in names
            else kw
            for kw in node.keywords
        ]
        self.calls += 1
        return ast.copy_location(ast.Call(func=f, args=args, keywords=keywords), node)


def scale_pyautogui_code(code: str, scale: ScreenScale) -> str:
    """``code`` with every pyautogui mouse call's position moved from image pixels to screen pixels.

    Unchanged (the same string) when the scale is the identity or no call needs rewriting, so text
    that does not parse is left for the runner to report. ``ast.unparse`` drops comments.
    """
    if scale.identity:
        return code
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    rewriter = _Rewriter(scale)
    tree = ast.fix_missing_locations(rewriter.visit(tree))
    if not rewriter.calls:
        return code
    return (HELPERS if rewriter.needs_helpers else "") + ast.unparse(tree)


def _scale_pair_text(text: str, fx: float, fy: float) -> str:
    """``"(x, y)"`` with both numbers divided by the factors (image pixels), the rest as it is."""
    inner = text.strip()
    if not (inner.startswith("(") and inner.endswith(")")):
        return text
    parts = inner[1:-1].split(",")
    if len(parts) != 2:
        return text
    try:
        x, y = float(parts[0]), float(parts[1])
    except ValueError:
        return text
    return f"({round(x / fx)}, {round(y / fy)})"


def scale_tree_table(table: str, scale: ScreenScale) -> str:
    """The linearised tree (``a11y.linearize``) with positions and sizes in image pixels."""
    if scale.identity:
        return table
    lines = table.split("\n")
    out = lines[:1]
    for line in lines[1:]:
        cells = line.split("\t")
        if len(cells) >= 7:
            cells[-2] = _scale_pair_text(cells[-2], scale.sx, scale.sy)
            cells[-1] = _scale_pair_text(cells[-1], scale.sx, scale.sy)
        out.append("\t".join(cells))
    return "\n".join(out)
