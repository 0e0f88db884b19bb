"""Partition reads from storage: verified ranged reads, buffers, gathers and prefetch."""
