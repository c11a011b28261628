"""The daemon: its loop, the one pass and the sources that feed it."""
