"""The trivial job bench/launch_cost.py times: init, one all-reduce, one line per rank with the CPU
seconds the rank used so far (its imports and the rendezvous), a barrier, exit."""

import resource
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
used = resource.getrusage(resource.RUSAGE_SELF)
# One write: a line two ranks write at once into one pipe never interleaves (-u writes print's "\n" apart).
sys.stdout.write(f"rank {dist.get_rank()} ready cpu={used.ru_utime + used.ru_stime:.3f} sum={value.item():g}\n")
sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
