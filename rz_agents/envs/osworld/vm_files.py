"""The in-VM server's file helpers: a directory as a tree, a multipart upload's fields."""

from __future__ import annotations

import os
from typing import Any


def directory_tree(path: str) -> dict[str, Any]:
    """``{"type": "directory", "name", "children": [...]}`` for ``path`` (files as ``{"type": "file"}``)."""
    node: dict[str, Any] = {
        "name": os.path.basename(path.rstrip("/")) or path,
        "type": "directory",
        "children": [],
    }
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False):
            node["children"].append(directory_tree(entry.path))
        else:
            node["children"].append({"name": entry.name, "type": "file"})
    return node


def parse_multipart(ctype: str, raw: bytes) -> dict[str, Any]:
    """Fields of a ``multipart/form-data`` body: text fields as str, file fields as bytes."""
    from email import message_from_bytes
    from email.policy import HTTP

    msg = message_from_bytes(f"Content-Type: {ctype}\r\n\r\n".encode() + raw, policy=HTTP)
    out: dict[str, Any] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        out[name] = payload if part.get_filename() else payload.decode()
    return out
