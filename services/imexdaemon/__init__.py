"""The IMEX daemon wrapper (``gpudra imex-daemon run|check``), one per node of a ComputeDomain.

It renders NVIDIA's IMEX configuration and peer list, keeps the peer list current
from the bus's ``domains`` bucket, runs and watches the IMEX binary, reports its
readiness in its own member key and answers the pods' probes. Real mode runs
``nvidia-imex`` / ``nvidia-imex-ctl``; simulated mode runs a stand-in
(:mod:`services.imexdaemon.standin`) that is READY only when every peer in its
node list answers on its port, so readiness is earned, not declared.
"""
