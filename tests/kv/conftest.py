"""pytest fixtures of the fs3.kv suite (defined in kv_engines.py)."""

from kv_engines import db, fdb_cluster_file

__all__ = ["db", "fdb_cluster_file"]
