"""Unit tests of the project as a whole: docs, CLI, import contracts."""
