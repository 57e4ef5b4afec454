"""What the ranks are doing and what went wrong: failures as data and their root cause, what every
rank is doing now (ranks.py: the one look that `distrun stack`, the hang watchdog and the stall
detector take), the progress watchdog and its stalls, stacks, Flight Recorder dumps, stragglers
(stragglers.py: late to enter; held.py: held off the CPU), the job's progress from
the Flight Recorders (progress.py), the collectives' arrival skew (skew.py) and crashes at
interpreter exit."""
