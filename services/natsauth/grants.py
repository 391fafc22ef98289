"""Which ServiceAccount may be which bus role, and how a token names its role.

The chart gives each component its own ServiceAccount, except the node pod:
discovery, preparer and kubelet plugin share one pod and so one account. Each
container therefore mounts a projected token of its own audience,
``<audience>:<role>`` (``gpudra-nats:preparer``), and the auth service takes the
role from the audience the API server confirmed, if the account may hold it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from services.core.bus.access import Role

SA_PREFIX = "system:serviceaccount:"


class GrantError(ValueError):
    """A grant that does not parse: ``ROLE=NAMESPACE/NAME``."""


@dataclass(frozen=True)
class Account:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_grant(text: str) -> tuple[Role, Account]:
    """``preparer=gpu-system/gpudra-node`` -> (Role.PREPARER, that account)."""
    role_text, eq, who = text.strip().partition("=")
    namespace, slash, name = who.partition("/")
    if not (eq and slash and namespace and name) or "/" in name:
        raise GrantError(f"want ROLE=NAMESPACE/SERVICEACCOUNT, got {text!r}")
    try:
        role = Role(role_text)
    except ValueError:
        valid = ", ".join(r.value for r in Role)
        raise GrantError(f"unknown role {role_text!r} in {text!r} (one of {valid})") from None
    return role, Account(namespace, name)


def parse_grants(texts: Iterable[str]) -> dict[Account, frozenset[Role]]:
    """Every grant, comma- or space-separated, as account -> roles it may hold."""
    out: dict[Account, set[Role]] = {}
    for text in texts:
        for item in text.replace(",", " ").split():
            role, account = parse_grant(item)
            out.setdefault(account, set()).add(role)
    return {account: frozenset(roles) for account, roles in out.items()}


def account_of(username: str) -> Account | None:
    """``system:serviceaccount:NS:NAME`` -> Account; None for any other user."""
    if not username.startswith(SA_PREFIX):
        return None
    namespace, _, name = username[len(SA_PREFIX) :].partition(":")
    return Account(namespace, name) if namespace and name and ":" not in name else None


def audience(base: str, role: Role) -> str:
    """The token audience that names ``role``: ``gpudra-nats:preparer``."""
    return f"{base}:{role.value}"


def role_of_audiences(base: str, audiences: Iterable[str]) -> Role | None:
    """The one role named by ``audiences`` (None: none, several, or an unknown one)."""
    prefix = f"{base}:"
    named = {a[len(prefix) :] for a in audiences if a.startswith(prefix)}
    if len(named) != 1:
        return None
    try:
        return Role(named.pop())
    except ValueError:
        return None


def describe(grants: Mapping[Account, frozenset[Role]]) -> dict[str, list[str]]:
    """For the start-up log line."""
    return {str(a): sorted(r.value for r in roles) for a, roles in grants.items()}
