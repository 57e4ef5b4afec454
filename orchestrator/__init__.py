"""distrun: run PyTorch distributed jobs across hosts reached over SSH, locally or on Slurm."""

__version__ = "0.1.0"
