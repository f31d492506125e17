"""The config reference, generated from the schema's dataclasses: every field, its type, default and meaning.

A field's meaning is read from the dataclass's own source, where the code already says it, in this order:
1. a comment on the field's line (``max_len: int = 512  # positions per sequence``);
2. the comment block right above the field;
3. the class docstring: an entry that starts a line with the field's name (``max_running: the most ...``,
   ``prefix_cache / prefix_cache_ttl_s: ...``, ``cpus_per_*: ...``, ``- name: ...``) and runs on over
   the more-indented lines after it; or else the first sentence that names it as ````name````.
Inherited fields are looked up in the class that declares them. ``field_docs`` reports a field with none
of these as undocumented (the test of the reference fails on it), so a new field cannot land without a
word on what it does.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
import re
import textwrap
import typing
from dataclasses import MISSING, dataclass
from typing import Any

_NAME = r"(?:``[\w*]+``|[\w*]+)"
_ENTRY = re.compile(rf"^(\s*)(?:[-*]\s+)?({_NAME}(?:\s*/\s*{_NAME})*)\s*:\s?(.*)$")


@dataclass(frozen=True)
class FieldDoc:
    """One row of the reference: ``path`` (dotted), ``type``, ``default`` (as YAML would show it) and
    ``doc``."""

    path: str
    type: str
    default: str
    doc: str


def _owner(cls: type, name: str) -> type:
    """The class in ``cls``'s MRO whose body declares the field ``name``."""
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            return klass
    return cls


def _source_lines(cls: type) -> list[str]:
    try:
        return textwrap.dedent(inspect.getsource(cls)).splitlines()
    except (OSError, TypeError):
        return []


def _comment_docs(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line, or the comment block right above it, in ``cls``'s own body."""
    docs: dict[str, str] = {}
    lines = _source_lines(cls)
    field_line = re.compile(r"^\s{4}(\w+)\s*:")
    for i, line in enumerate(lines):
        m = field_line.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        name = m.group(1)
        code, _, trailing = line.partition("  #")
        if trailing.strip():
            docs[name] = trailing.strip()
            continue
        block: list[str] = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            block.insert(0, lines[j].strip().lstrip("#").strip())
            j -= 1
        if block:
            docs[name] = " ".join(block)
    return docs


def _docstring_entries(doc: str) -> list[tuple[list[str], str]]:
    """``(names, text)`` for each ``name[ / name2]: text`` entry of a docstring, continuation lines joined."""
    entries: list[tuple[list[str], str]] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        m = _ENTRY.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        names = [n.strip().strip("`") for n in m.group(2).split("/")]
        text = [m.group(3).strip()]
        i += 1
        while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) > indent:
            if _ENTRY.match(lines[i]) and len(lines[i]) - len(lines[i].lstrip()) == indent:
                break
            text.append(lines[i].strip())
            i += 1
        entries.append((names, " ".join(t for t in text if t)))
    return entries


def _sentence_naming(doc: str, name: str) -> str | None:
    """What ``doc`` says of ````name````: the clause that first mentions it (between ``;`` / sentence ends
    outside parentheses), running on over the next clause while it is too short to say anything
    (``top_k``, ``top_p``; ...); None when ``doc`` does not mention it."""
    flat = " ".join(doc.split())
    at = min((i for i in (flat.find(f"``{name}``"), flat.find(f"`{name}`")) if i >= 0), default=-1)
    if at < 0:
        return None
    depth, ends = 0, []  # clause ends outside parentheses
    for i, c in enumerate(flat):
        depth = max(depth + (c == "(") - (c == ")"), 0)
        if depth == 0 and (c == ";" or (c == "." and flat[i + 1 : i + 2] in ("", " "))):
            ends.append(i)
    start = max((e + 1 for e in ends if e < at), default=0)
    for e in ends:
        if e >= at and len(flat[start:e].split()) >= 4:
            return flat[start:e].strip().lstrip("-* ")  # (a list item's marker is no part of it)
    return flat[start:].strip().lstrip("-* ")


def _as_sentence(text: str, default: str) -> str:
    """``text`` as a whole sentence: a comment continuing the default (``# or "leave_one_out"``) gets the
    default in front; a capital first letter, and a full stop at the end."""
    text = text.strip()
    if not text:
        return text
    if re.match(r"^(or|and)\b", text):
        text = f"{default} (default) {text}"
    if text[0].islower():
        text = text[0].upper() + text[1:]
    text = text.rstrip(";,")
    return text if text.endswith((".", "!", "?")) else text + "."


def _docstring_doc(cls: type, name: str) -> str | None:
    doc = inspect.getdoc(cls) or ""
    for names, text in _docstring_entries(doc):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in names) and text:
            return text
    return _sentence_naming(doc, name)


def field_doc(cls: type, name: str) -> str | None:
    """What the source says of field ``name`` of dataclass ``cls`` (see the module docstring), or None."""
    owner = _owner(cls, name)
    return _comment_docs(owner).get(name) or _docstring_doc(owner, name)


def _type_text(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("NoneType", "None")


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "(section)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value) if value == "" else value
    return repr(value)


def field_docs(cls: type, prefix: str = "") -> list[FieldDoc]:
    """Every field of dataclass ``cls``, sections first-level-in-order and recursed into (dotted paths)."""
    hints = typing.get_type_hints(cls)
    rows: list[FieldDoc] = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        tp = hints.get(f.name, f.type)
        path = f"{prefix}{f.name}"
        doc = field_doc(cls, f.name) or ""
        section = _dataclass_of(tp)
        if section is not None:
            if not doc:
                doc = (inspect.getdoc(section) or "").split("\n\n")[0].replace("\n", " ")
            rows.append(FieldDoc(path, section.__name__, "(section)", doc))
            rows.extend(field_docs(section, path + "."))
        else:
            default = _default_text(f)
            rows.append(FieldDoc(path, _type_text(tp), default, _as_sentence(doc, default)))
    return rows


def _dataclass_of(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    return None


def undocumented(cls: type) -> list[str]:
    """Dotted paths of the fields of ``cls`` (recursively) that have no doc."""
    return [row.path for row in field_docs(cls) if not row.doc.strip()]


def renamed_fields(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    """(old dotted path, new dotted path) of every renamed field of ``cls`` and its sections (their
    ``RENAMED_FIELDS``, which config_io still reads under the old names)."""
    found = [(prefix + old, prefix + new) for old, new in getattr(cls, "RENAMED_FIELDS", {}).items()]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        section = _dataclass_of(hints.get(f.name, f.type))
        if f.init and section is not None:
            found += renamed_fields(section, f"{prefix}{f.name}.")
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown(cls: type, title: str, intro: str) -> str:
    """The whole reference page: one table per top-level section, top-level scalars first."""
    rows = field_docs(cls)
    out = [f"# {title}", "", intro.strip(), ""]
    top = [r for r in rows if "." not in r.path and r.default != "(section)"]
    sections = [r for r in rows if "." not in r.path and r.default == "(section)"]
    header = ["| field | type | default | meaning |", "|---|---|---|---|"]

    def table(items: list[FieldDoc]) -> list[str]:
        return header + [
            f"| `{r.path}` | `{_cell(r.type)}` | `{_cell(r.default)}` | {_cell(r.doc)} |" for r in items
        ]

    out += ["## Top level", ""] + table(top) + [""]
    for sec in sections:
        out += [f"## `{sec.path}`", "", _cell(sec.doc), ""]
        out += table([r for r in rows if r.path.startswith(sec.path + ".")]) + [""]
    renamed = renamed_fields(cls)
    if renamed:
        out += [
            "## Renamed fields",
            "",
            "These old names still load for one release (a one-line deprecation warning names the new one);",
            "giving the old and the new name in one file is an error.",
            "",
            "| old name | new name |",
            "|---|---|",
        ]
        out += [f"| `{old}` | `{new}` |" for old, new in renamed] + [""]
    return "\n".join(out).rstrip() + "\n"
