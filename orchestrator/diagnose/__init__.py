"""What the ranks are doing and what went wrong: failures as data and their root cause, the progress
watchdog, stacks, Flight Recorder dumps, stragglers and crashes at interpreter exit."""
