"""The shells and kernels that ``overhead.py`` (and ``overhead_count.py``, ``overhead_objects.py``)
measure: a long-lived IPython shell driven through its stdin, a real kernel, and the cells that
put the extension to sleep and wake it, so both sides are measured in one process.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
import time

__all__ = ["NO_MIRROR", "SHELL", "TOGGLE", "Kernel", "Shell"]

# A shell that takes commands as JSON lines on stdin and answers one JSON line each.
SHELL = textwrap.dedent(
    """
    import contextlib, io, json, os, sys, threading, time
    from IPython.testing.globalipapp import start_ipython
    shell = start_ipython()
    out = os.fdopen(os.dup(1), "w")  # the answers; whatever the cells print goes elsewhere
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    sys.stdout = sys.__stdout__ = io.StringIO()
    for line in sys.stdin:
        command = json.loads(line)
        sys.stdout.seek(0)
        sys.stdout.truncate()
        if "run" in command:
            result = shell.run_cell(command["run"], store_history=True)
            error = result.error_in_exec or result.error_before_exec
            answer = {"error": repr(error) if error else None}
        elif "measure" in command:
            code, count = command.get("code", "x = 1"), command["measure"]
            times, cpu, process = [], [], []
            for _ in range(count):
                began, began_cpu = time.perf_counter(), time.thread_time()
                began_process = time.process_time()
                shell.run_cell(code, store_history=True)
                cpu.append(time.thread_time() - began_cpu)
                process.append(time.process_time() - began_process)
                times.append(time.perf_counter() - began)
            answer = {"median": sorted(times)[len(times) // 2], "mean": sum(times) / len(times),
                      "max": max(times), "first": times[: count // 10 or 1],
                      "last": times[-(count // 10 or 1):], "cpu": sorted(cpu)[count // 2],
                      "process_cpu": sorted(process)[count // 2]}
        elif "paced" in command:  # cells a person's pace apart: the pause is not measured
            code, count, pause = command.get("code", "x = 1"), command["paced"], command["pause"]
            times, cpu = [], []
            for _ in range(count):
                time.sleep(pause)
                began, began_cpu = time.perf_counter(), time.thread_time()
                shell.run_cell(code, store_history=True)
                cpu.append(time.thread_time() - began_cpu)
                times.append(time.perf_counter() - began)
            answer = {"median": sorted(times)[count // 2], "cpu": sorted(cpu)[count // 2]}
        elif "profile" in command:  # where a row's time goes: the cells under cProfile
            import cProfile, pstats
            code, count, pause = command.get("code", "x = 1"), command["profile"], command["pause"]
            profiler = cProfile.Profile()
            for _ in range(count):
                time.sleep(pause)
                profiler.enable()
                shell.run_cell(code, store_history=True)
                profiler.disable()
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text).sort_stats("tottime")
            stats.print_stats(command["lines"])
            answer = {"profile": text.getvalue()}
        elif "count" in command:  # under callgrind: the cells' instructions, per thread
            import ctypes
            marks = ctypes.CDLL(command["marks"])
            code, count = command.get("code", "x = 1"), command["count"]
            marks.marks_zero()
            for _ in range(count):
                shell.run_cell(code, store_history=True)
            marks.marks_dump(command["label"].encode())
            answer = {}
        elif "hooks" in command:  # under callgrind: jax_nbmem's two callbacks alone, gc off
            import ctypes, gc, types
            from jax_nbmem.notebook import magics
            marks = ctypes.CDLL(command["marks"])
            hooks = magics._loaded[id(shell)][1]
            pre, post = hooks["pre_run_cell"], hooks["post_run_cell"]
            info = types.SimpleNamespace(raw_cell="x = 1")
            result = types.SimpleNamespace(success=True, error_in_exec=None,
                                           error_before_exec=None, execution_count=1)
            for _ in range(50):
                pre(info), post(result)
            gc.collect()
            gc.disable()  # a collection lands in one pair of hundreds: counted apart
            marks.marks_zero()
            for _ in range(command["hooks"]):
                pre(info), post(result)
            marks.marks_dump(command["label"].encode())
            gc.enable()
            answer = {}
        elif "objects" in command:  # the distinct functions a cell calls, traced
            code, count = command.get("code", "x = 1"), command["objects"]
            def c_name(f):
                owner = getattr(f, "__self__", None)
                if owner is None or type(owner).__name__ == "module":
                    return f"{getattr(f, '__module__', None) or '?'}.{f.__name__}"
                return f"{type(owner).__name__}.{f.__name__}"
            py_n, c_n, calls_n, names = [], [], [], set()
            for _ in range(count):
                py, c, calls = set(), set(), [0]
                def profile(frame, event, arg):
                    if event == "call":
                        py.add(frame.f_code)
                        calls[0] += 1
                    elif event == "c_call":
                        c.add(c_name(arg))
                        calls[0] += 1
                sys.setprofile(profile)
                shell.run_cell(code, store_history=True)
                sys.setprofile(None)
                py_n.append(len(py)), c_n.append(len(c)), calls_n.append(calls[0])
                names.update(f"{os.path.basename(f.co_filename)}:{f.co_firstlineno} "
                             f"{f.co_qualname}" for f in py if "ipython-input" not in f.co_filename)
                names.update(f"C {name}" for name in c)
            middle = count // 2
            answer = {"python": sorted(py_n)[middle], "c": sorted(c_n)[middle],
                      "calls": sorted(calls_n)[middle], "names": sorted(names),
                      "package": sys.modules["jax_nbmem"].__file__}
        elif "sampler_cpu" in command:
            import psutil
            from jax_nbmem.gpu import nvml
            threads = {t.native_id: t.name for t in threading.enumerate()}
            wanted = [i for i, name in threads.items() if name == "jax_nbmem-sampler"]
            inside = [0.0]
            def timed(function):  # CPU time the sampler's thread spends inside NVML calls
                def call(*args):
                    if threading.current_thread().name != "jax_nbmem-sampler":
                        return function(*args)
                    began = time.thread_time()
                    try:
                        return function(*args)
                    finally:
                        inside[0] += time.thread_time() - began
                return call
            nvml._memory = timed(nvml._memory)
            nvml._process_lists = timed(nvml._process_lists)
            def cpu():
                mine = {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
                return sum(mine.get(i, 0.0) for i in wanted)
            start, began = cpu(), time.monotonic()
            time.sleep(command["sampler_cpu"])
            took = time.monotonic() - began
            answer = {"share": (cpu() - start) / took, "nvml_share": inside[0] / took,
                      "found": len(wanted)}
        elif "rss" in command:
            import psutil
            answer = {"rss": psutil.Process().memory_info().rss}
        out.write(json.dumps(answer) + "\\n")
        out.flush()
    """
)


class Shell:
    """One long-lived IPython shell in a subprocess, driven through its stdin."""

    def __init__(self, env: dict[str, str], prefix: tuple[str, ...] = ()) -> None:
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-c", SHELL],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def ask(self, **command) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the benchmark shell died ({self.process.poll()})")
        return json.loads(line)

    def run(self, code: str) -> None:
        answer = self.ask(run=code)
        if answer["error"]:
            raise RuntimeError(f"setup cell failed: {answer['error']}\n{code}")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(60)


class Kernel:
    """A real ipykernel, driven as a notebook frontend drives it."""

    def __init__(self, env: dict[str, str]) -> None:
        from jupyter_client.manager import KernelManager

        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(env=env)
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str) -> None:
        reply = self.client.execute_interactive(code, timeout=300, output_hook=lambda m: None)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"setup cell failed in the kernel: {code}")

    def ask(self, measure: int, code: str = "x = 1") -> dict:
        times = []
        for _ in range(measure):
            began = time.perf_counter()
            self.client.execute_interactive(code, timeout=60, output_hook=lambda m: None)
            times.append(time.perf_counter() - began)
        return {"median": statistics.median(times), "max": max(times)}

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


# Defined in the measured shell or kernel: puts the loaded extension to sleep (its hooks
# unregistered, its sampler, status watch and panel threads stopped) or wakes it again. Asleep
# it costs nothing per cell, so both sides are measured in the same process and the same
# state; two processes differ in speed by themselves by more than what is measured here.
TOGGLE = """
def _jax_nbmem_awake(on):
    from jax_nbmem.notebook import magics
    ip = get_ipython()
    entry = magics._loaded[id(ip)]
    session, callbacks = entry[0].session, entry[1]
    for event, callback in callbacks.items():
        registered = callback in ip.events.callbacks[event]
        if on and not registered:
            ip.events.register(event, callback)
        if not on and registered:
            ip.events.unregister(event, callback)
    state = getattr(session, "_panel_state", None)
    live = getattr(state, "live", None)
    if on:
        session.start()
        if live is not None:
            live.start()
    else:
        if live is not None:
            live.close()
        session.watcher.stop()
        if session.sampler is not None:
            session.sampler.stop()
"""


# The demo's simulated-GPU mirror looks after every cell (the real driver's work, simulated):
# never in a row, whatever the environment the benchmark was started from.
NO_MIRROR = (
    "import sys\n"
    "assert 'jax_nbmem.simgpu.mirror' not in sys.modules, 'a startup file started the mirror'"
)
