"""The metadata service (fs3-meta): the POSIX namespace over fs3.kv."""
