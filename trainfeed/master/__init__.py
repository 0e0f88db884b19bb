"""The master: indexes datasets into partitions and leases them to readers as tasks."""
