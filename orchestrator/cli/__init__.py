"""The `distrun` command line: one module per family of commands (launch, jobs, hosts, reports, logs),
their shared options and near-miss hints; `main.py` is the entry point and maps errors to exit codes."""
