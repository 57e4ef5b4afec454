"""A job's lines on the controller: stored once, shown on the terminal, read back by `distrun logs`.

- `sink`: what an attempt writes every batch to (the job directory, the summary's tails, metrics);
- `screen`: the terminal side (a queue of its own, noise folded, `--collapse`);
- `format`: the one line format (`[node1 r3] text`);
- `query`: reading a job directory back, filters, following;
- `command`: `distrun logs`;
- `recover`: `--recover`, the job's files rebuilt from its hosts' copies.

The layout of the files is remote/linestore.py's, the same in the hosts' copies.
"""

from orchestrator.logs.sink import METRICS_MARK, LogSink, parse_metrics

__all__ = ["METRICS_MARK", "LogSink", "parse_metrics"]
