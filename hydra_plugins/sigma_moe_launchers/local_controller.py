"""A local sweep job's controller: submitit's own (submitit/local/_local.py), except that a
Ctrl-C stops its training runs with a checkpoint.

submitit's controller meets SIGINT by sending its tasks a second SIGINT at once and SIGKILL
a second later: a run that got the Ctrl-C too, and would finish its step and write a
checkpoint, stops at once instead and loses its steps since the last checkpoint. The local
launcher (`LocalLauncher`) starts this controller in a session of its own, out of reach of
the terminal's Ctrl-C, and passes each Ctrl-C on to the job's process group: the tasks get
one SIGINT per Ctrl-C (the first: checkpoint and stop; the second: stop at once), and this
controller ignores its own copy and waits for them to end. Should the launcher die (killed,
or its terminal closed), the tasks get one SIGINT: they checkpoint and stop rather than run
on unseen.

Run as a script (`python local_controller.py <submitit folder>`) so that it imports nothing
of this project: the job's environment comes from submitit (start_controller).
"""
import os
import signal
import sys
import threading
import time
from pathlib import Path

LAUNCHER_PID = "SIGMA_MOE_LAUNCHER_PID"  # env: the process whose death stops the job


def stop_when_gone(pid: int, poll_s: float = 1.0) -> None:
    """Send this process group one SIGINT once process `pid` has ended."""
    while True:
        time.sleep(poll_s)
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):  # gone (or its pid another user's)
            os.killpg(os.getpgrp(), signal.SIGINT)
            return


def main(folder: str) -> None:
    from submitit.local.local import Controller

    # A handler, not SIG_IGN: the tasks would inherit SIG_IGN, and so not see a Ctrl-C.
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    launcher = int(os.environ.get(LAUNCHER_PID, "0"))
    if launcher:
        threading.Thread(target=stop_when_gone, args=(launcher,), daemon=True).start()
    Controller(Path(folder)).run()


if __name__ == "__main__":
    main(*sys.argv[1:])
