"""What a slice check reports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One reason the API server would reject (or a consumer misread) a slice."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"
