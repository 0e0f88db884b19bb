"""The `trainfeed` command line."""
