"""megarl.utils.descendants: the subtree under the children named by their command line, found through
/proc and ended after a grace even once reparented; other children and reused pids are left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from megarl.utils.descendants import alive, descendants, end

# a child that starts a grandchild ignoring SIGTERM, prints its pid and waits
TREE = """
import signal, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
print(grandchild.pid, flush=True)
time.sleep(300)
"""


def test_the_named_subtree_is_found_and_ended_after_its_root_died():
    marker = "megarl-test-descendants-tree"
    tree = subprocess.Popen([sys.executable, "-c", TREE, marker], stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        grandchild = int(tree.stdout.readline())
        listed = descendants(child_cmd=marker)
        assert {pid for pid, _ in listed} == {tree.pid, grandchild}
        assert {pid for pid, _ in descendants()} >= {tree.pid, grandchild, other.pid}
        os.kill(tree.pid, signal.SIGKILL)  # the grandchild is init's now, as Ray's workers after ray.shutdown
        tree.wait()
        assert grandchild not in {pid for pid, _ in descendants()}
        start = time.monotonic()
        assert end(listed, grace_s=0.5) == set()
        assert time.monotonic() - start < 5
        assert not alive(listed)
        assert other.poll() is None  # not under the named children: untouched
    finally:
        for proc in (tree, other):
            proc.kill()
            proc.wait()


def test_a_pid_with_another_start_time_is_not_alive():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        (listed,) = descendants(child_cmd="time.sleep(300)")
        assert alive({listed}) == {listed}
        assert alive({(listed[0], listed[1] + 1)}) == set()  # the pid reused by another process
    finally:
        proc.kill()
        proc.wait()
