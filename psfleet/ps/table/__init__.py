"""The sparse table: hash index, shards, rules, lifecycle (statistics, admission,
eviction, shrink) and the disk tier's glue.

Only ``psfleet.ps``'s service and persistence parts use it; it imports nothing of
``ps/`` above it but the shared vocabulary (``ps.types``, ``ps.hashing``, ``ps.merge``).
"""
