"""Imported by the fork server of ``chorus serve``'s job processes, and by nothing else (it is in
:data:`~chorus.serving.onboarding.job_process.PRELOAD`): the fork server ignores SIGTERM, as Python's own
resource tracker does (and SIGINT, which the jobs it forks inherit).

Ctrl-C in a terminal (SIGINT) and ``systemctl stop`` (SIGTERM, with systemd's default
``KillMode=control-group``) signal every process of the server, the fork server and the job's process
too, not only the server. The server's stop is what ends a job well: its process stops training at the next
step and the next start trains it again. A fork server killed by the signal first would take with it the
exit status of the job it forked, which the server then reads as 255 and fails the job, its uploaded clips
deleted. Python's fork server already ignores SIGINT; SIGTERM is ignored here, before it forks any job, so
the jobs it forks inherit that too. It still ends when the server does (it reads the server's end of a
pipe), and SIGKILL ends it as any process.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
# Python's fork server ignores SIGINT itself but gives each job the handler it found at its start, which raises
# KeyboardInterrupt until the job's own code ignores it: ignored here, before that start, a job never has it.
signal.signal(signal.SIGINT, signal.SIG_IGN)
