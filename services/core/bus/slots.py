"""The consumers an identity may create: a few names of its own, on each stream it reads.

nats-server bounds consumers per stream (``max_consumers``; 1,000 by default since
2.15) and per account, never per user; its legacy ephemeral API
(``$JS.API.CONSUMER.CREATE.<stream>``) and its durable one
(``$JS.API.CONSUMER.DURABLE.CREATE.<stream>.<name>``) let whoever may use them make
as many as the stream takes. A front, the least privileged identity, made 1,000
durable consumers on ``KV_inventory`` in 2.1 s, and the publisher's inventory watch
was then refused ("maximum consumers limit reached") until they were deleted.

The newer API names the consumer in the subject,
``$JS.API.CONSUMER.CREATE.<stream>.<name>``, and the server gives the consumer that
name whatever the request's body says; a publish permission can therefore list the
names an identity may create: :data:`SLOTS` of them, derived from the identity's
name (:func:`consumer_names`). No permission grants the other creation subjects
(the auditor's replays of ``CLAIMS`` aside), so one identity holds at most
:data:`SLOTS` consumers on a stream, durable or not, however it asks; what it may
delete is only those. A service takes a free name for each watch
(:mod:`services.core.bus.ordered`) and deletes its consumer when done.
"""

from __future__ import annotations

import hashlib
from functools import cache

#: Consumers one identity may hold on one stream at a time. Each watch or key listing
#: holds one while it runs; publisher replicas share an identity, and a crashed
#: process's consumers stay until :data:`INACTIVE_S` has passed without interest.
SLOTS = 16
#: How long the server keeps a consumer nobody listens to (its process crashed).
INACTIVE_S = 60.0


@cache
def consumer_names(identity: str) -> tuple[str, ...]:
    """The consumer names ``identity`` (``preparer.<node token>``) may create and delete:
    ``<role>-<hash of the identity>-<slot>``, valid consumer names (no ``.``, at most 64
    characters whatever the node's name) that say whose they are."""
    role = identity.partition(".")[0]
    digest = hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()
    return tuple(f"{role}-{digest}-{slot:02d}" for slot in range(SLOTS))
