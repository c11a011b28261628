"""The shared test kit: namespaces and daemons (helpers), the real kube-apiserver
(apiserver), the real registry (registry_env, pki) and the fabric lab guest (vm, labkit).
Imported by the tests, bench/ and tools/demo.py as `tests.kit.<module>`; the venv made by
tools/bootstrap puts the repository root on the import path."""
