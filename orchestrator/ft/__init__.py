"""Per-step fault tolerance with torchft (`fault_tolerance:` in a job file).

The job's hosts split into replica groups (`groups.py`, pure). Each group is its own distrun
launch of its own torchrun (`--nnodes` = its hosts), run by a child controller with the job's
`restarts` and spares, so a lost group is relaunched while the others go on stepping. A torchft
lighthouse beside the parent controller (`lighthouse.py`) forms the quorum every step;
`replicas.py` starts both, follows them and ends the job.
"""
