"""The client library (routing cache, mgmtd/meta/storage clients, native file API) and the FUSE mount."""
