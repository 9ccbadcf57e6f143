"""What mallory leaves where root will look (a script, run as her through as_user.py).

    python plant.py link TARGET NAME   NAME becomes a symbolic link to TARGET
    python plant.py fifo NAME          NAME becomes a FIFO

Whatever was at NAME is removed first (she may: the folder is one she can write).
"""

import os
import sys


def main() -> None:
    what, *args = sys.argv[1:]
    name = args[-1]
    try:
        os.unlink(name)
    except FileNotFoundError:
        pass
    if what == "link":
        os.symlink(args[0], name)
    elif what == "fifo":
        os.mkfifo(name, 0o666)
    else:
        raise SystemExit(f"plant.py: no such thing as {what!r}")


if __name__ == "__main__":
    main()
