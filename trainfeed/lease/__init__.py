"""What a reader says to the master: the lease client and the session."""
