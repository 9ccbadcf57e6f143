"""Run a test's script as another Unix user, from root's Python (run as a script).

    python as_user.py UID GID SCRIPT [ARGS...]

Root's interpreter may live where another user cannot read it (/root is 0700), so the script
is read first, then the process drops to ``UID``/``GID`` (no supplementary groups) and runs
it as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]``: a process of that user, as the agent
sees it (its socket's UID, its ``/proc`` owner). The scripts use the standard modules
imported here only.
"""

import importlib
import os
import sys

# What the scripts import, imported before the drop: root's standard library may be
# unreadable to the user afterwards.
_THEIR_MODULES = ("ctypes", "fcntl", "json", "select", "signal", "socket", "time")


def main() -> None:
    uid, gid, script = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with open(script, encoding="utf-8") as file:
        source = file.read()
    for name in _THEIR_MODULES:
        importlib.import_module(name)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    sys.argv = [script, *sys.argv[4:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    exec(compile(source, script, "exec"), {"__name__": "__main__", "__file__": script})


if __name__ == "__main__":
    main()
