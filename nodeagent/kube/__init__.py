"""Kubernetes API client plumbing: the client, watches and field parsing."""
