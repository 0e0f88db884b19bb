"""The master: indexes datasets into partitions and leases them to readers as tasks.

Its folders show its shape (issue 36):

- `core/`: the pure parts. The coordinator, the ledger, stealing, sync groups, the delivery
  order, admission, sessions, the jobs' types and the readers' board. They take the time as an
  argument and touch no socket, clock, thread, event loop or store (import-linter holds them to
  it: pyproject.toml, tests/test_layers.py).
- `serve/`: the shells around the core. The gRPC servicer and server, the token check, the
  health service, the HTTP page and metrics, the status snapshot, the journal writer, and
  starting a master as a process.
- `stores/`: where a job's state is kept so that a restarted master resumes it (SQLite, etcd,
  memory), behind one `StateStore` contract.
"""
