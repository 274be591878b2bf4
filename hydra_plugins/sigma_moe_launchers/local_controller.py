"""A local sweep job's controller: submitit's own (submitit/local/_local.py), except that a
Ctrl-C stops its training runs with a checkpoint.

submitit's controller meets SIGINT by sending its tasks a second SIGINT at once and SIGKILL
a second later: a run that got the Ctrl-C too, and would finish its step and write a
checkpoint, stops at once instead and loses its steps since the last checkpoint. The local
launcher (`LocalLauncher`) starts this controller in a session of its own, out of reach of
the terminal's Ctrl-C, and passes each Ctrl-C on to the job's process group: the tasks get
one SIGINT per Ctrl-C (the first: checkpoint and stop; the second: stop at once), and this
controller only notes its own copy. Should the launcher die (killed, or its terminal
closed), the tasks get one SIGINT (none if it passed one on already): they checkpoint and
stop rather than run on unseen. A SIGINT sent to this process alone (`kill -INT`, submitit's
LocalJob.cancel) is only noted: signal the job's process group instead.

The launcher starts it with SIGINT blocked, so that a Ctrl-C while Python starts waits
(pending) for `main`'s handler: one before the tasks start stops the job there, one while
they start reaches those that missed it.

Run as a script (`python local_controller.py <submitit folder>`) so that it imports nothing
of this project: the job's environment comes from submitit (start_controller).
"""
import os
import signal
import sys
import threading
import time
from pathlib import Path

LAUNCHER_PID = "SIGMA_MOE_LAUNCHER_PID"  # env: the parent whose death stops the job


def stop_when_orphaned(launcher: int, interrupts: list[int], poll_s: float = 1.0) -> None:
    """Send this process group one SIGINT once the launcher has died (its children then
    have another parent; a dead but unreaped launcher still counts as dead), unless it
    passed on a Ctrl-C before: a second SIGINT would stop the tasks before their
    checkpoint."""
    while os.getppid() == launcher:
        time.sleep(poll_s)
    if not interrupts:
        os.killpg(os.getpgrp(), signal.SIGINT)


def main(folder: str) -> None:
    # at each SIGINT, how many tasks had started: those got it too (the job's process group)
    interrupts: list[int] = []
    controller = None
    signal.signal(signal.SIGINT, lambda signum, frame: interrupts.append(
        len(controller.tasks) if controller is not None else 0))
    # A handler, not SIG_IGN: the tasks would inherit SIG_IGN, and so not see a Ctrl-C.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    from submitit.local.local import Controller

    class Interruptible(Controller):
        def start_tasks(self) -> None:
            if interrupts:  # stopped before it started: nothing to checkpoint
                raise SystemExit(128 + signal.SIGINT)
            super().start_tasks()
            for started in interrupts:  # a Ctrl-C while they started: to those that missed it
                for task in self.tasks[started:]:
                    task.send_signal(signal.SIGINT)

    launcher = int(os.environ.get(LAUNCHER_PID, "0"))
    if launcher:
        threading.Thread(target=stop_when_orphaned, args=(launcher, interrupts),
                         daemon=True).start()
    controller = Interruptible(Path(folder))
    controller.run()


if __name__ == "__main__":
    main(*sys.argv[1:])
