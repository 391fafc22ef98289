"""Discovery: a node's GPUs, read through NVML, kept in the KV bucket ``inventory``.

Layout, bottom up:

- ``backend``: the NVML backend interface (one query per call) and the NVML
  error hierarchy both implementations raise.
- ``nvml``: the real backend over pynvml (imported lazily); ``sysfs`` for the
  PCIe root and VFIO facts NVML does not give.
- ``models`` + ``profiles/*.yaml``: GPU models and their published MIG tables;
  ``fleet`` + ``fleets/*.yaml``: simulated nodes; ``simstate``: the simulated
  driver state (KV ``simnvml``); ``sim``: the simulated backend over it;
  ``simstore``: compare-and-set changes to that state from any process.
- ``mig``: create/destroy a MIG device (GI + CI, all or nothing) on any backend.
- ``inventory``: NodeInventory from any backend, errors isolated per GPU;
  ``health``: XIDs, lost/recovered GPUs; ``service``: the asyncio loop;
  ``simcontrol``: answers ``dra.sim.<node>`` MIG requests; ``cli``: the
  ``gpudra discovery`` and ``gpudra sim`` commands.

Changing a simulated node from Python (tests, tools in this package)::

    store = SimStore(bus)
    dev = await store.create_mig_device(node, gpu_index, "1g.10gb", placement=6)
    await store.destroy_mig_device(node, gpu_index, dev.gi_id, dev.ci_id)
    await store.inject_xid(node, gpu_index, 79)
    await store.set_lost(node, gpu_index, True)

Other services (the preparer) send ``SimMigRequest`` to ``dra.sim.<node>``
instead, so they import nothing from here.
"""
