"""One way to declare a flag: ``--name``, else ``GPUDRA_NAME``, else the default, typed once."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from services.core.process import config


def _parser(*, lazy: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpudra test")
    config.flag(parser, "workers", int, 16, "nodes synced at once", lazy=lazy)
    return parser


def test_a_flag_defaults_to_its_variable_typed_and_a_given_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUDRA_WORKERS", raising=False)
    assert _parser().parse_args([]).workers == 16
    monkeypatch.setenv("GPUDRA_WORKERS", "7")
    parser = _parser()
    assert parser.get_default("workers") == 7  # typed as the parser is built
    assert parser.parse_args([]).workers == 7
    assert parser.parse_args(["--workers", "3"]).workers == 3


def test_a_bad_value_is_refused_as_argparse_refuses_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPUDRA_WORKERS", raising=False)
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["--workers", "x"])
    assert exc.value.code == 2
    assert (
        "gpudra test: error: argument --workers: invalid int value: 'x'" in capsys.readouterr().err
    )
    monkeypatch.setenv("GPUDRA_WORKERS", "x")
    with pytest.raises(ValueError):  # converted as the parser is built, as before
        _parser()


def test_a_lazy_flag_leaves_the_variable_to_argparse(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUDRA_WORKERS", "x")
    parser = _parser(lazy=True)
    assert parser.get_default("workers") == "x"
    assert parser.parse_args(["--workers", "2"]).workers == 2
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "argument --workers: invalid int value: 'x'" in capsys.readouterr().err


def test_an_optional_flag_is_none_without_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    monkeypatch.delenv("GPUDRA_CA", raising=False)
    config.flag(parser, "ca", Path, None)
    assert parser.parse_args([]).ca is None
    monkeypatch.setenv("GPUDRA_CA", "/tls/ca.crt")
    parser = argparse.ArgumentParser()
    config.flag(parser, "ca", Path, None)
    assert parser.parse_args([]).ca == Path("/tls/ca.crt")


def test_a_flag_may_read_a_variable_of_another_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDRA_IMEX_SERVER_PORT", "1234")
    monkeypatch.setenv("GPUDRA_SERVER_PORT", "9")
    parser = argparse.ArgumentParser()
    config.flag(parser, "server-port", int, 50000, env_name="imex-server-port")
    assert parser.parse_args([]).server_port == 1234


def test_a_switch_is_on_when_given_or_when_its_variable_is_true(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def parsed(*argv: str) -> bool:
        parser = argparse.ArgumentParser()
        config.switch(parser, "force-registered", "publish at once")
        return bool(parser.parse_args(argv).force_registered)

    monkeypatch.delenv("GPUDRA_FORCE_REGISTERED", raising=False)
    assert not parsed()
    assert parsed("--force-registered")
    monkeypatch.setenv("GPUDRA_FORCE_REGISTERED", "yes")
    assert not parsed()
    monkeypatch.setenv("GPUDRA_FORCE_REGISTERED", "true")
    assert parsed()


def test_a_service_has_the_common_flags_then_its_own_and_runs_its_main() -> None:
    def main(args: argparse.Namespace) -> int:
        return 0

    def flags(parser: argparse.ArgumentParser) -> None:
        config.flag(parser, "shards", int, 64)

    parser = argparse.ArgumentParser()
    config.service(parser.add_subparsers(), "svc", "a service", main, flags)
    args = parser.parse_args(["svc", "--shards", "2", "--nats-url", "tls://bus:4222"])
    assert (args.shards, args.nats_url, args.func) == (2, "tls://bus:4222", main)


def test_settings_take_each_field_from_the_flag_of_its_name() -> None:
    @dataclasses.dataclass(frozen=True)
    class Settings:
        node: str
        nats_url: str
        timeout: float = 45.0

    args = argparse.Namespace(node_name="n1", nats_url="tls://bus:4222", command="svc")
    assert config.settings(Settings, args, node=args.node_name) == Settings("n1", "tls://bus:4222")


def test_a_parsed_value_says_what_is_wrong_with_it() -> None:
    def even(value: str) -> int:
        if int(value) % 2:
            raise LookupError(f"{value} is odd")
        return int(value)

    assert config.parsed(even, "4", LookupError) == 4
    with pytest.raises(argparse.ArgumentTypeError, match="3 is odd"):
        config.parsed(even, "3", LookupError)
