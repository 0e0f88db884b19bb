"""The worker side: talking to the master, reading partitions, prefetching them."""
