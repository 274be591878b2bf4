"""`python tests/windows_like.py SCRIPT ARGS...`: run SCRIPT as `python SCRIPT ARGS...` would,
in a Python without what Windows lacks: fcntl, resource and triton, os.fchmod and the other
POSIX-only os functions the code could reach, SIGUSR1/SIGUSR2/SIGHUP, and with `spawn`
processes (Windows' and macOS's default). Third-party packages are imported first, as they
check sys.platform themselves (torch registers an at-fork hook unless on Windows).

Not Windows itself (paths, file sharing and the C runtime are Linux's): what it checks is that
the code uses no POSIX-only module or function without a fallback.
"""
import multiprocessing
import os
import runpy
import signal
import sys

import hydra  # noqa: F401
import numpy  # noqa: F401
import torch  # noqa: F401
import tqdm  # noqa: F401

for module in ("fcntl", "resource", "triton"):
    sys.modules[module] = None
for name in ("fchmod", "register_at_fork", "killpg", "getpgrp", "sched_getaffinity"):
    if hasattr(os, name):
        delattr(os, name)
for name in ("SIGUSR1", "SIGUSR2", "SIGHUP"):
    if hasattr(signal, name):
        delattr(signal, name)
multiprocessing.set_start_method("spawn", force=True)

sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
