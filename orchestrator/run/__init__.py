"""One run of a job: the restart loop over its attempts (launch.py), one attempt followed to its end
(attempt.py), each host of it (hostrun.py), what starts the next attempt (restarts.py), the spares
several controllers share, the recorded jobs' backends and pruning, and (ft/) a fault-tolerant job
run as replica groups beside a lighthouse."""
