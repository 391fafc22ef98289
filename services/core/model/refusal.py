"""The one root of every expected claim failure.

A claim a node will not prepare (a config it refuses, a device it cannot find, a
conflict, a driver installation that cannot serve it) fails with the reason, and the
service and every other claim go on; anything else is a bug and is logged as one.
The preparer's service catches :class:`ClaimRefused` alone (in one place,
``PreparerService._outcome``), the webhook its
:class:`~services.core.model.opaque.ConfigError` kind.
"""

from __future__ import annotations


class ClaimRefused(Exception):
    """A claim refused, and why: the message becomes the claim's error."""
