"""One-line texts for error messages about a model: quoted names, node labels, an exception's first line."""

from __future__ import annotations

import onnx

__all__ = ["first_line", "node_label", "quote", "shown"]


def first_line(exc: BaseException) -> str:
    """The first meaningful line of an exception's text (at most 300 characters), else its type's name."""
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("==>"):
            return line[:300]
    return type(exc).__name__


def quote(name: str, limit: int = 80) -> str:
    """A name quoted for a one-line message: control characters escaped, long names shortened."""
    text = repr(name)
    return text if len(text) <= limit else f"{text[: limit - 4]}...{text[-1]}"


def shown(name: str, limit: int = 60) -> str:
    """A name unquoted for a one-line summary: control characters escaped, long names shortened."""
    text = name if name.isprintable() else repr(name)[1:-1]
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def node_label(node: onnx.NodeProto, index: int) -> str:
    """``node 'name' (Op)``, or ``unnamed Op node #index`` for a node without a name."""
    return f"node {quote(node.name)} ({node.op_type})" if node.name else f"unnamed {node.op_type} node #{index}"
