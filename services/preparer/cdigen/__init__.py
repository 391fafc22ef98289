"""The CDI generator: what NVIDIA's toolkit (nvcdi) writes for a driver installation.

``driver`` finds the installation (version, library folder, every library of
that version, binaries, firmware, IPC sockets, graphics files) under the
driver root as the toolkit's locators do (``lookup``, ``ldcache``, ``elf``);
``devfs`` reads device nodes; ``hooks`` renders the ``nvidia-cdi-hook`` calls;
``caps`` gives MIG capability nodes; ``transform`` is the toolkit's simplify
and host-root rewrite; ``generator`` caches common edits per installation and
assembles each claim's spec. See docs/architecture.md (CDI specs).
"""
