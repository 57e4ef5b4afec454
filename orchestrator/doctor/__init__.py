"""`distrun doctor`: the command and its all-reduce bandwidth job.

    command.py          the command: select, probe, check, render, exit status
    bandwidth.py        the all-reduce job that measures the links (a real launch)
    bandwidth_check.py  that job's check and table
    allreduce_bench.py  the script the job runs on every host

The probe round, the checks on its facts, their table and the launch's preflight are in
orchestrator/hostcheck/, which every launch uses as well.
"""
