"""cel-cpp's errors and type names in the words cel-go (and so Kubernetes) uses.

The runtime is cel-cpp (cel-expr-python); kube-scheduler and kube-apiserver run
cel-go. A message a user or a differential test compares must read as cel-go's.
"""

from __future__ import annotations

import re
from typing import Any

from services.allocator.cel import types as celtypes


def status_text(text: str) -> str:
    """Strip the absl status code cel-expr-python puts around messages."""
    text = re.sub(r"^[A-Z_]+: ", "", text.strip())
    return re.sub(r" \[[A-Z_]+\]$", "", text)


def runtime_message(text: str) -> str:
    """A cel-cpp runtime error in the words cel-go (and so kube-scheduler) uses."""
    text = status_text(text)
    missing = re.fullmatch(r'Key not found in map : "?(.*?)"?', text)
    if missing:
        return f"no such key: {missing.group(1)}"
    if text.startswith("No matching overloads found"):
        return "no such overload" + text.removeprefix("No matching overloads found").replace(
            " : ", ": ", 1
        )
    if text == "divide by zero":
        return "division by zero"
    return text


def type_name(t: Any) -> str:
    """A type as cel-go prints it: ``list(string)``, ``optional_type(kubernetes.URL)``."""
    name = re.sub(r"[A-Za-z_][\w.]*", _type_word, str(t.name()))
    name = name.replace("<", "(").replace(">", ")").replace(",", ", ").replace(",  ", ", ")
    return {"list": "list(dyn)", "map": "map(dyn, dyn)"}.get(name, name)


def _type_word(match: re.Match[str]) -> str:
    """Builtin type names in lower case; message names (with a dot) as they are."""
    word = match.group()
    return word if "." in word else word.lower()


def kubernetes_names(text: str) -> str:
    """Our message types by the names Kubernetes gives them, in cel-go's words."""
    text = text.replace(celtypes.QUANTITY_TYPE, "kubernetes.Quantity")
    text = text.replace(celtypes.SEMVER_TYPE, "kubernetes.Semver")
    return text.replace("cannot be the range of", "cannot be range of")
