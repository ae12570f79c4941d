"""The built-in tasks load once, even when several threads ask for a task at the same moment."""

import subprocess
import sys

PROGRAM = """
import threading
from echo_rl.environments import registry

barrier = threading.Barrier(8)
errors = []

def look():
    barrier.wait()
    try:
        registry.task_spec("minigrid")
        registry.task_spec("terminal")
    except Exception as exc:  # the race showed as "task 'minigrid' is a vector task" / unknown task
        errors.append(repr(exc))

threads = [threading.Thread(target=look) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("errors", len(errors), errors[:1])
"""


def test_concurrent_first_lookups_see_every_builtin_task():
    for _ in range(3):  # a fresh interpreter each time: the race is on the first lookup only
        out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "errors 0 " in out.stdout, out.stdout
