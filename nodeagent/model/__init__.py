"""The types shared by probes, checks, remedies and publishers, one module per domain.

Probes produce observations (plain, immutable data read from the world), checks turn
observations into Findings, remedies turn drift into Actions. Nothing here does I/O.
"""
