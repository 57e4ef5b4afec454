"""Real multi-host tests: every host a network namespace with its own sshd (harness.py)."""
