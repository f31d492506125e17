"""Differential run: OSWorld's own metric functions against rz_agents' ports, on random inputs.

    python scripts/osworld_metrics_differential.py --osworld PATH [--cases 300] [--seed 44]

PATH is a checkout of OSWorld (``desktop_env/evaluators/metrics``; e.g. pkueecszc/OSWorld at
be0b6285, the task files' source). Nothing of OSWorld is copied here: its metric files are loaded
from PATH one by one (the package's ``__init__`` imports every library of every metric), with the
libraries they import but the compared functions never call (pandas, formulas, xmltodict,
rapidfuzz, pdfplumber, PyPDF2) replaced by empty stand-ins. An exception in either side counts as
a 0, as it fails the evaluation in OSWorld. Prints per metric the cases run and the disagreements
(with up to three examples); exit 1 when any, except for the known version differences named.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import string
import sys
import tempfile
import types
from typing import Any


class _Stub:
    def __getattr__(self, name: str) -> _Stub:
        return _Stub()

    def __call__(self, *a: Any, **k: Any) -> _Stub:
        return _Stub()


def _module_stub(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def attr(key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        return _Stub()

    module.__getattr__ = attr  # type: ignore[method-assign]
    return module


def _stub_modules() -> None:
    """Empty stand-ins for the libraries missing here (the compared functions never call them)."""
    libraries = {"pandas": (), "formulas": (), "xmltodict": (), "rapidfuzz": ("fuzz",), "pdfplumber": (),
                 "PyPDF2": (), "easyocr": (), "odf": ("opendocument", "text"),
                 "skimage": ("color",)}  # fmt: skip
    for name, submodules in libraries.items():
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = _module_stub(name)
            for sub in submodules:
                sys.modules[f"{name}.{sub}"] = _module_stub(f"{name}.{sub}")
                setattr(sys.modules[name], sub, sys.modules[f"{name}.{sub}"])


def _load(root: str, module: str) -> types.ModuleType:
    """One file of OSWorld's metrics package, loaded alone under its package name."""
    pkg = "desktop_env.evaluators.metrics"
    for name in ("desktop_env", "desktop_env.evaluators", pkg):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, *name.split("."))]
            sys.modules[name] = package
    path = os.path.join(root, *pkg.split("."), f"{module}.py")
    spec = importlib.util.spec_from_file_location(f"{pkg}.{module}", path)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


# Functions whose official code changed between OSWorld versions, the port following the later one.
KNOWN_VERSION_DIFFERENCES = {
    "check_thunderbird_folder": "OSWorld's older code skips every non-empty message (`if mail.strip(): "
    "continue`), so folders of non-empty messages all compare equal; later code skips the empty ones, as the "
    "port does",
}
WORDS = ["alpha", "Beta", "gamma", "x1", "org.gnome.Nautilus", "  pad ", "", "ICML", "2019", "a b", "\t", "Ω"]


def _docx(tmp: str, paragraphs: list[str], rng: random.Random) -> str:
    from docx import Document

    doc = Document()
    for text in paragraphs:
        doc.add_paragraph(text)
    path = os.path.join(tmp, f"d{rng.random()}.docx")
    doc.save(path)
    return path


def _mp3(tmp: str, rng: random.Random) -> str | None:
    """A file with ID3 tags (EasyID3 reads only the tags), or one without any (None on both sides)."""
    from mutagen.easyid3 import EasyID3
    from mutagen.id3 import ID3

    path = os.path.join(tmp, f"m{rng.random()}.mp3")
    with open(path, "wb") as f:
        f.write(b"\xff\xfb\x90\x00" + bytes(400))
    if rng.random() < 0.9:
        ID3().save(path)
        tags = EasyID3(path)
        for key in rng.sample(["title", "artist", "album"], k=rng.randint(0, 3)):
            tags[key] = rng.sample(["Beta", "x1", "Ω"], k=rng.randint(1, 2))
        tags.save()
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--osworld", required=True, help="an OSWorld checkout")
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=44)
    args = parser.parse_args()
    _stub_modules()
    import openpyxl

    from rz_agents.envs.osworld.metrics import METRICS

    general, table, vscode = (_load(args.osworld, m) for m in ("general", "table", "vscode"))
    docs, thunderbird, others = (_load(args.osworld, m) for m in ("docs", "thunderbird", "others"))
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="rz_osworld_diff_")

    def wfile(text: str) -> str:
        path = os.path.join(tmp, "".join(rng.choices(string.ascii_lowercase, k=12)))
        with open(path, "w") as f:
            f.write(text)
        return path

    def rtext(n: int = 6) -> str:
        lines = (" ".join(rng.choices(WORDS, k=rng.randint(0, 3))) for _ in range(rng.randint(0, n)))
        return "\n".join(lines) + rng.choice(["", "\n", "\n\n"])

    def score(fn: Any, *a: Any, **k: Any) -> float:
        try:
            return round(float(fn(*a, **k)), 9)
        except Exception:  # noqa: BLE001 - an exception fails the evaluation: 0
            return 0.0

    cases: dict[str, list[Any]] = {}

    def case(name: str, official: Any, *a: Any, **k: Any) -> None:
        theirs, ours = score(official, *a, **k), score(METRICS[name], *a, **k)
        entry = cases.setdefault(name, [0, 0, []])
        entry[0] += 1
        if theirs != ours:
            entry[1] += 1
            if len(entry[2]) < 3:
                entry[2].append((a, k, theirs, ours))

    for _ in range(args.cases):
        patterns = rng.sample(
            ["alpha", "^Beta", r"\bx1\b", "gnome\\.Nautilus", "zzz", "a b$", "Ω"], k=rng.randint(0, 3)
        )
        unexpect = rng.sample(["zzz", "gamma", "^$", "pad"], k=rng.randint(0, 2))
        rules = {"expect": patterns[: rng.randint(0, len(patterns))], "unexpect": unexpect}
        case("check_list", general.check_list, rng.choice([wfile(rtext()), None]), rules)

        a, b = wfile(rtext()), wfile(rtext())
        case("diff_text_file", general.diff_text_file, rng.choice([a, a, None]), b)

        result = rng.choice(["alpha beta", "x", "", "packages in environment at /x", ["alpha", "b"]])
        wanted = rng.choice(["alpha", "x", "packages in environment at", "b"])
        case("is_in_list", general.is_in_list, result, {"expected": wanted})

        opts = {k: rng.choice([True, False]) for k in ("ignore_blanks", "ignore_case") if rng.random() < 0.6}
        t1 = rtext(3)
        t2 = rng.choice([t1, t1.upper(), t1.replace(" ", "\t"), t1 + "\n", rtext(3)])
        actual = rng.choice([wfile(t1), wfile(t1), None, ""])
        case("compare_text_file", vscode.compare_text_file, actual, wfile(t2), **opts)

        opts = {k: rng.choice([True, False]) for k in ("strict", "ignore_case") if rng.random() < 0.6}
        rows = (",".join(rng.choices(["a", "B", " c ", "1"], k=3)) for _ in range(rng.randint(0, 4)))
        c1 = "\n".join(rows)
        c2 = rng.choice([c1, c1.lower(), c1.replace("c", " c"), c1 + "\n", c1 + "\nx"])
        case("compare_csv", table.compare_csv, rng.choice([wfile(c1), wfile(c1), None]), wfile(c2), **opts)

        obj = {
            k: rng.choice(["v", 1, ["v", "w"], None, "vw"]) for k in rng.sample("abc", k=rng.randint(0, 3))
        }
        exp = {
            k: rng.choice(["v", 1, ["v", "x"], None, "w", ["q"]])
            for k in rng.sample("abc", k=rng.randint(0, 2))
        }
        text = json.dumps(obj)
        result = rng.choice([obj, text, text.replace('"', "'"), " " + text + "\n", None, "not json"])
        rules = {"expected": exp}
        if rng.random() < 0.7:
            rules["expect_in_result"] = rng.choice([True, False])
        case("check_direct_json_object", general.check_direct_json_object, result, rules)

        doc = {"a": {"b": rng.choice([1, "x", [1, 2], None])}, "c": rng.choice(["y", 2])}

        def rule() -> dict[str, Any]:
            return {
                "key": rng.choice([["a", "b"], ["c"], ["a", "z"], ["z"]]),
                "method": rng.choice(["eq", "ne", "lt", "ge", "re", "re.I"]),
                "ref": rng.choice([1, "x", "y", 2, None, "^X"]),
            }

        rules = {"expect": [rule() for _ in range(rng.randint(0, 2))],
                 "unexpect": [rule() for _ in range(rng.randint(0, 2))]}  # fmt: skip
        case("check_json", general.check_json, rng.choice([wfile(json.dumps(doc)), None]), rules)

        wb = openpyxl.Workbook()
        cities = ["Beijing", "Lille", "New York City", "Sydney", None, "Long Beach"]
        for row in range(2, 23):
            wb.active.cell(row=row, column=3, value=rng.choice(cities))
        path = os.path.join(tmp, f"cities{rng.random()}.xlsx")
        wb.save(path)
        alternatives = ["Beijing", ["Lille", "Paris"], "New York", "Sydney", ["Long Beach", "LA"]]
        expected = [rng.choice(alternatives) for _ in range(rng.randint(18, 23))]
        case(
            "compare_conference_city_in_order",
            table.compare_conference_city_in_order,
            path,
            {"expected": expected},
        )

    for _ in range(args.cases):
        paragraphs = [rtext(1).strip("\n") for _ in range(rng.randint(0, 4))]
        other = rng.choice([paragraphs, [p.upper() for p in paragraphs], paragraphs[::-1],
                            [p.replace(" ", "  ") for p in paragraphs], paragraphs + [""]])  # fmt: skip
        a, b = _docx(tmp, paragraphs, rng), _docx(tmp, other, rng)
        opts = {k: rng.choice([True, False]) for k in ("ignore_blanks", "ignore_case", "ignore_order")
                if rng.random() < 0.6}  # fmt: skip
        case("compare_docx_files", docs.compare_docx_files, rng.choice([a, a, None, a[:-1]]), b, **opts)

        mails = [f"From: {rng.choice(['a', 'b'])}\nX-Mozilla-Status: 000{rng.choice('0189')}\n"
                 f"X-Mozilla-Keys: {rng.choice(['', 'label1'])}\nMIME-Version: 1.0\n\n{rng.choice(WORDS)}"
                 for _ in range(rng.randint(0, 3))]  # fmt: skip
        gold = rng.choice([mails, mails[::-1], mails + mails[:1], [m.replace("0001", "0000") for m in mails]])
        opts = {k: rng.choice([True, False])
                for k in ("ignore_status", "ignore_keys", "remove_deleted", "remove_duplicate")
                if rng.random() < 0.5}  # fmt: skip
        pred = wfile(rng.choice(["", "\n"]) + "".join("FROM - " + m + "\n" for m in mails))
        ref = wfile("".join("FROM - " + m + "\n" for m in gold))
        case("check_thunderbird_folder", thunderbird.check_thunderbird_folder, rng.choice([pred, pred, None]),
             ref, **opts)  # fmt: skip

        mp3 = _mp3(tmp, rng)
        meta = {k: {"method": rng.choice(["eq", "ne", "re"]), "ref": rng.choice(["Beta", "x1", "", "^B"])}
                for k in rng.sample(["title", "artist", "album"], k=rng.randint(0, 3))}  # fmt: skip
        case("check_mp3_meta", others.check_mp3_meta, rng.choice([mp3, mp3, None]), meta)

    bad = 0
    for name, (n, disagreements, examples) in cases.items():
        known = KNOWN_VERSION_DIFFERENCES.get(name)
        bad += 0 if known else disagreements
        print(
            f"{name:34s} cases {n:4d} disagreements {disagreements}" + (f" (known: {known})" if known else "")
        )
        for example in examples:
            print("    ", str(example)[:300])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
