"""Bounded I/O with the host: files, HTTP deadlines, child processes, systemd."""
