"""The publisher's wiring: the bus, the API server, one publisher per driver, and with
replicas the shard leases; with --gpu-clique-label the Nodes' clique labels."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc

from services.core.bus import subjects, usage
from services.core.bus.access import Identity, Role
from services.core.kube.resourceapi import versioned
from services.core.model import featuregates
from services.core.model.computedomain import CD_DRIVER
from services.core.process import config
from services.core.process.serve import Stack
from services.publisher.kubeapi import KubeSliceApi
from services.publisher.render import RenderOptions
from services.publisher.service import Publisher, PublisherConfig
from services.publisher.tuning import GC_GEN0

#: The buckets the publisher reads, whose fill it reports (services/core/bus/usage.py).
BUCKETS = [
    usage.bucket(b)
    for b in (subjects.INVENTORY_BUCKET, subjects.PRESENCE_BUCKET, subjects.PREPARED_BUCKET,
              subjects.PUBLISHERS_BUCKET)
]  # fmt: skip


def settings(args: argparse.Namespace) -> PublisherConfig:
    return PublisherConfig(
        render=RenderOptions(
            gates=args.feature_gates,
            extra_non_fatal_xids=args.additional_xids_to_ignore,
            shares=config.consumable_shares(args, "publisher"),
        ),
        kube_minor=args.kube_version,
        force_registered=args.force_registered,
        workers=args.workers,
        resync_s=args.resync_interval,
        binding_conditions=args.binding_conditions,
    )


async def start(args: argparse.Namespace, stack: Stack) -> None:
    gc.set_threshold(GC_GEN0, *gc.get_threshold()[1:])  # tuning.py: why
    bus = await stack.bus(args.nats_url, name="publisher", identity=Identity(Role.PUBLISHER))
    raw = await stack.kube(args.kubeconfig, qps=args.kube_api_qps, burst=args.kube_api_burst)
    manager = f"gpudra-publisher-{args.replica_id}" if args.replica_id else ""
    api = KubeSliceApi(versioned(raw), field_manager=manager)
    publisher = Publisher(api, settings(args))
    if args.gpu_clique_label:
        from services.publisher.cliquelabel import CliqueLabeler

        strict = args.feature_gates.enabled(featuregates.CRASH_ON_NVLINK_FABRIC_ERRORS)
        labeler = CliqueLabeler(api.api, strict=strict)
        publisher.on_inventory = labeler.set_inventory
        stack.spawn("clique labels", labeler.run)
    publishers = [publisher]
    if args.compute_domains:
        domain_api = KubeSliceApi(api.api, field_manager=manager, driver=CD_DRIVER)
        domains = dataclasses.replace(publisher.config, driver=CD_DRIVER)
        publishers.append(Publisher(domain_api, domains))
    if args.replica_id:
        _shard(stack, bus, args, publishers)
    for each in publishers:
        stack.spawn(f"publisher {each.config.driver}", functools.partial(each.run, bus))
    stack.spawn("bus usage", functools.partial(usage.watch, bus, BUCKETS), fatal=False)


def _shard(
    stack: Stack, bus: object, args: argparse.Namespace, publishers: list[Publisher]
) -> None:
    """Replicas: each publishes the nodes of the shards it leases (shards.py)."""
    from services.publisher.shards import Shards

    shards = Shards(bus, args.replica_id, count=args.shards)  # type: ignore[arg-type]
    for each in publishers:
        each.owns = shards.owns

    def gained(shards_gained: set[int]) -> None:
        for each in publishers:
            each.take(lambda n: shards.shard(n) in shards_gained)

    shards.on_gain = gained
    stack.spawn("shard leases", shards.run)
