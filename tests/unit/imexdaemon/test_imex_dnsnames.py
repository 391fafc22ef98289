"""IMEXDaemonsWithDNSNames: the static node list and the hosts file the daemon keeps."""

from __future__ import annotations

from pathlib import Path

from services.imexdaemon import dnsnames


def test_the_node_list_names_every_index_as_the_reference() -> None:
    text = dnsnames.static_nodes(18)
    assert text.splitlines()[0] == "compute-domain-daemon-0000"
    assert text.splitlines()[-1] == "compute-domain-daemon-0017"
    assert len(text.splitlines()) == 18 and text.endswith("\n")


def test_the_hosts_file_keeps_the_pods_lines_and_replaces_only_ours(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n# a comment\n10.0.0.7\tnode-a\n")
    names = dnsnames.mapping([(1, "10.0.0.9"), (0, "10.0.0.8")], 18)
    assert names == {"10.0.0.8": "compute-domain-daemon-0000",
                     "10.0.0.9": "compute-domain-daemon-0001"}  # fmt: skip
    assert dnsnames.update_hosts(hosts, names)
    first = hosts.read_text()
    assert first == (
        "127.0.0.1\tlocalhost\n# a comment\n10.0.0.7\tnode-a\n"
        "# Compute Domain Daemon mappings\n"
        "10.0.0.8\tcompute-domain-daemon-0000\n10.0.0.9\tcompute-domain-daemon-0001\n"
    )
    assert not dnsnames.update_hosts(hosts, names)  # the same names: nothing written
    # A peer leaves, another comes back with a new address: only our block changes, once.
    assert dnsnames.update_hosts(hosts, dnsnames.mapping([(0, "10.0.0.18")], 18))
    assert hosts.read_text() == (
        "127.0.0.1\tlocalhost\n# a comment\n10.0.0.7\tnode-a\n"
        "# Compute Domain Daemon mappings\n10.0.0.18\tcompute-domain-daemon-0000\n"
    )
    assert dnsnames.read_hosts(hosts)["compute-domain-daemon-0000"] == "10.0.0.18"
    assert "compute-domain-daemon-0001" not in dnsnames.read_hosts(hosts)


def test_a_missing_hosts_file_is_made_and_an_index_beyond_the_list_gets_no_name(
    tmp_path: Path,
) -> None:
    hosts = tmp_path / "hosts"
    assert dnsnames.update_hosts(hosts, dnsnames.mapping([(0, "10.0.0.1"), (18, "10.0.0.2")], 18))
    assert hosts.read_text() == (
        "# Compute Domain Daemon mappings\n10.0.0.1\tcompute-domain-daemon-0000\n"
    )


def test_resolution_as_a_resolver_reads_hosts() -> None:
    hosts = {"compute-domain-daemon-0000": "10.0.0.1"}
    assert dnsnames.resolve("compute-domain-daemon-0000", hosts) == "10.0.0.1"
    assert dnsnames.resolve("compute-domain-daemon-0001", hosts) is None  # an empty slot
    assert dnsnames.resolve("10.0.0.5", hosts) == "10.0.0.5"  # an address is itself
