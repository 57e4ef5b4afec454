"""What a host has and whether it can run the job: the probe round, the checks on its facts, and the
table they make. `distrun doctor` and every launch's preflight use it."""
