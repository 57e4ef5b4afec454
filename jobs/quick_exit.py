"""End a torch.distributed job process without the interpreter's teardown.

Why: destroy_process_group() does not stop gloo's threads (torch keeps the process group
object alive), and such a thread that lets go of a tensor Python also refers to takes the
GIL to do it. When the main thread has already begun finalizing the interpreter, Python
ends that thread with pthread_exit; the unwind meets a noexcept destructor in torch, and
the process dies with "terminate called without an active exception" and SIGABRT after
all its work was done. Leaving with os._exit once the output is flushed never finalizes,
so no thread can be caught that way. bench/results/teardown.md has the backtrace and counts.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def quick_exit(code: int | None) -> NoReturn:
    """Flush logging, stdout and stderr, then exit the process at once with `code` (None: 0).

    Only for a script's `__main__` path, after its process group is destroyed: atexit
    handlers and object finalizers do not run.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code or 0)
