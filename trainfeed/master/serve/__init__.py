"""The master's shells: the gRPC servicer and server, the token check and health service, the
HTTP status page and metrics, the journal writer, and a master started as a local process.

They read the clock, hold the sockets, the event loop and the writer thread, and call the pure
core (trainfeed.master.core) for every decision.
"""
