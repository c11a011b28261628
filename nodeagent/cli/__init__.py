"""User-facing commands: nodeagent (main), kubectl fabric (fleet), alerts."""
