"""A process's descendants from /proc, with and without its own group's members."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from hybrid_llm.local.proctree import descendants, kill_leftovers

# A leader of a new session starts one child in its group and one in a session
# of its own (as the central gateway starts replicas), prints both pids, and sleeps.
_TREE = """
import subprocess, sys, time
same = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
apart = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         start_new_session=True)
print(same.pid, apart.pid, flush=True)
time.sleep(60)
"""


def test_descendants_outside_the_group_are_the_workers_a_group_kill_misses() -> None:
    leader = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert leader.stdout is not None
    try:
        same, apart = (int(x) for x in leader.stdout.readline().split())
        assert os.getpgid(same) == leader.pid != os.getpgid(apart)
        every = {pid for pid, _ in descendants(leader.pid)}
        assert every == {same, apart}
        outside = descendants(leader.pid, outside_group=leader.pid)
        assert [pid for pid, _ in outside] == [apart]
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
        leader.stdout.close()
    # The group is gone; the worker in its own session is left until killed.
    assert kill_leftovers(outside) == [apart]
