"""Many hosts at once: a group of connections with a result per host, `distrun exec`, the workdir
sync and the checkpoint_dir check that run on every host before a launch."""
