"""Per-step fault tolerance with torchft (`fault_tolerance:` in a job file).

The job's hosts split into replica groups (`groups.py`, pure). Each group is its own distrun
launch of its own torchrun (`--nnodes` = its hosts), run by a child controller with the job's
`restarts` and spares, so a lost group is relaunched while the others go on stepping. A torchft
lighthouse on a host of the job (`lighthouse.py`; a job of its own, moved when its host is lost)
forms the quorum every step, reached through a forwarder on each group's host
(remote/ftforward.py). `replicas.py` starts them, follows them and ends the job.
"""
