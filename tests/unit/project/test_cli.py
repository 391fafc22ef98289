"""The ``gpudra`` entry: each sub-command is found in its module; a process imports its own."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

from services import cli


def test_the_command_table_is_what_the_modules_register() -> None:
    registered: dict[str, str] = {}
    for module in cli._service_clis():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(module).register(sub)
        registered.update({name: module for name in sub.choices})
    assert registered == cli.COMMANDS


def test_a_node_process_imports_only_its_own_service() -> None:
    code = (
        "import json, sys; from services.cli import build_parser; "
        "build_parser('kubeletplugin').parse_args(['kubeletplugin', '--node-name', 'n']); "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('services.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules = json.loads(out.stdout)
    assert "services.kubeletplugin.cli" in modules
    others = ("services.allocator", "services.discovery", "services.offline", "services.preparer")
    assert not [m for m in modules if m.startswith(others)], modules


def test_help_and_unknown_commands_still_see_every_command() -> None:
    parser = cli.build_parser("--help")
    choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(cli.COMMANDS) | {"nats", "provision"} == set(choices)
