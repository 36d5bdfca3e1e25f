"""The storage daemon (fs3-storage): chunk engine, CRAQ chain replication, resync.

- :mod:`fs3.storage.chunk_engine` (with ``chunk_meta``, ``chunk_files``, ``chunk_meta_store``,
  ``chunk_recovery``, ``async_engine``): the chunks of one target, versioned, in files and LMDB.
- :mod:`fs3.storage.target_map`: the daemon's targets, their local states and the startup protocol.
- :mod:`fs3.storage.craq`: writes along the chain, commits back up it, apportioned reads.
- :mod:`fs3.storage.resync`: bringing a returning (SYNCING) target up to date from its predecessor.
- :mod:`fs3.storage.service`: the RPC handlers (``proto/storage.proto``).
- :mod:`fs3.storage.daemon` and :mod:`fs3.storage.main`: the process (``fs3 storage``).

The client side is :mod:`fs3.client.storage_client`.
"""
