"""A rank that leaves a GPU held: it starts a child in a new session (stdout to /dev/null), the child
takes 2 GiB of CUDA memory and sleeps, and the rank exits 0 without waiting for it.

The child keeps the job's environment (DISTRUN_JOB_ID, DISTRUN_NODE), which is how the supervisor
knows it is the job's. Used by bench/gpu_run.sh on a lent GPU: distrun's summary must say which
process it freed, and nvidia-smi must list no compute process afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import time

HOLDER = ("import time, torch; x = torch.empty(2 * 1024**3, dtype=torch.uint8, device='cuda'); "
          "torch.cuda.synchronize(); time.sleep(600)")


def main() -> None:
    child = subprocess.Popen([sys.executable, "-c", HOLDER], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(12)  # long enough for the child to import torch and allocate
    print(f"left pid {child.pid} holding 2 GiB of CUDA memory", flush=True)


if __name__ == "__main__":
    main()
