"""The metadata service (fs3-meta): the POSIX namespace over fs3.kv (DESIGN §4, §7).

Modules, one concept each:

- :mod:`~fs3.meta.store` — :class:`MetaStore`, every operation as a library over one database
- :mod:`~fs3.meta.namespace` — lookups, readdir, creation (create, mkdir, mknod, symlink), retries
- :mod:`~fs3.meta.entries` — link, unlink, rmdir (plain and recursive), rename
- :mod:`~fs3.meta.attrs` — setattr, user xattrs, directory default layouts, statfs
- :mod:`~fs3.meta.sessions` — open/close/fsync, write sessions and length settlement
- :mod:`~fs3.meta.gc` — the collector of unlinked files and removed trees
- :mod:`~fs3.meta.idempotency` — expiry of the IDEM records of retried requests
- :mod:`~fs3.meta.permissions` — credentials, POSIX permission checks, name validation
- :mod:`~fs3.meta.inode`, :mod:`~fs3.meta.schema` — inode records and the key schema
- :mod:`~fs3.meta.idalloc` — inode ids from sharded counters reserved in blocks
- :mod:`~fs3.meta.layout` — chains of new files from the chain table
- :mod:`~fs3.meta.storage_io` — everything meta asks of storage, behind one interface
- :mod:`~fs3.meta.auth`, :mod:`~fs3.meta.service`, :mod:`~fs3.meta.daemon`, :mod:`~fs3.meta.main` —
  the RPC service and the ``fs3 meta`` daemon
"""
