"""The allocator, in three rooms: ``cel`` (the selector language), ``structured`` (the
allocation algorithm and its explanations) and ``watcher`` (the cluster side).

``cli`` is ``gpudra allocator`` (the watcher); ``gpudra allocate`` and ``gpudra
explain`` run ``structured`` over files from services/offline.
"""
