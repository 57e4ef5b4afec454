"""A torchrun worker whose local rank 1 fails as argv[1] says (raise, kill, segv, exit, raise-abort,
truncated-error-file, misshapen-error-file: its TORCHELASTIC_ERROR_FILE written so, then exit 1);
rank 0 waits. `raise-abort` raises outside `@record` and then aborts at interpreter exit, as gloo's
thread does ("terminate called without an active exception"): torchrun records only SIGABRT, and
the exception is in the rank's output.

The failures-<kind>.json beside it are what distrun's torchrun program (remote/distrun_torchrun.py) wrote for real
2-worker torchrun 2.13 runs of it on the project's test machine (`--standalone --nproc-per-node 2
--redirects 3`, argv as tests/test_workerfail.py's `run_torchrun` builds it), and error-raise.json
is what its rank 1 wrote itself (TORCHELASTIC_ERROR_FILE) on `raise`. `exit` leaves torch no
record of its own: the worker exits 3 without raising.
"""

import atexit
import ctypes
import os
import signal
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main(kind: str) -> None:
    if os.environ["LOCAL_RANK"] != "1":
        time.sleep(0.5)
        return
    if kind == "raise":
        raise ValueError("rank 1 says boom")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segv":
        ctypes.string_at(0)
    if kind.endswith("-error-file"):
        bad = '{"message": {"message": "ValueError: cut sh' if kind == "truncated-error-file" else '{"message": 5}'
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as fh:
            fh.write(bad)
        sys.exit(1)
    sys.exit(3)


if __name__ == "__main__":
    if sys.argv[1] == "raise-abort" and os.environ["LOCAL_RANK"] == "1":
        atexit.register(os.abort)
        raise RuntimeError("rank 1 says boom, then aborts")
    main(sys.argv[1])
