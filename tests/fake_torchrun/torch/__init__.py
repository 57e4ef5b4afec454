"""A stand-in `torch` package, only for `python -m torch.distributed.run` in fast tests (see run.py)."""
