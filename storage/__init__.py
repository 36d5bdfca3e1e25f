"""The storage daemon (fs3-storage): chunk engine, CRAQ chain replication, resync."""
