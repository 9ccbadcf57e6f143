"""The container harness itself, and the simulated GPU seen from containers (issue 31 item 5).

Two containers as a runtime makes them: their own host names, one Unix user, private homes,
one share directory, kernels with the same in-container PID; NVML lists host PIDs, from the
host and from inside, and forgets a container killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import textwrap

import psutil

from jax_nbmem.simgpu import SimState
from tests.waiting import wait_for

# NVML's list of GPU 0's processes through pynvml, as any client reads it (inside or on the host).
_NVML_PIDS = textwrap.dedent(
    """
    import json, pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    print(json.dumps({p.pid: p.usedGpuMemory for p in
                      pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}))
    """
)


def nvml_inside(container) -> dict[int, int]:
    done = container.python(_NVML_PIDS)
    assert done.returncode == 0, done.stderr
    return {int(pid): used for pid, used in json.loads(done.stdout).items()}


def test_containers_are_separate_hosts_of_one_user_sharing_one_directory(container_node):
    alice, bob = container_node.container("alice-box"), container_node.container("bob-box")
    said = {}
    for box in (alice, bob):
        done = box.python(
            "import os, socket, json, pathlib; home = pathlib.Path.home();"
            "(home / 'mine').write_text(socket.gethostname());"
            "print(json.dumps([socket.gethostname(), os.getuid(), os.getpid(), str(home),"
            " sorted(int(p) for p in os.listdir('/proc') if p.isdigit())]))"
        )
        assert done.returncode == 0, done.stderr
        said[box.name] = json.loads(done.stdout)
    (a_host, a_uid, a_pid, a_home, a_procs), (b_host, b_uid, b_pid, b_home, b_procs) = (
        said["alice-box"],
        said["bob-box"],
    )
    assert (a_host, b_host) == ("alice-box", "bob-box")
    assert a_uid == b_uid == container_node.user.uid  # one Unix user, jovyan
    assert a_pid == b_pid == 2  # the first process entered, in each
    assert a_procs == b_procs == [1, 2]  # each sees only its own processes
    assert a_home == b_home == str(container_node.user.home)  # the same path...
    assert (alice.home / "mine").read_text() == "alice-box"  # ...a home of each one's own
    assert (bob.home / "mine").read_text() == "bob-box"
    assert not (container_node.user.home / "mine").exists()
    assert alice.pid_namespace != bob.pid_namespace != os.stat("/proc/self/ns/pid").st_ino
    # One share directory, mounted at the same path in both.
    share = container_node.share_dir / "note"
    done = alice.run(["sh", "-c", f"echo from-alice > {share}"])
    assert done.returncode == 0, done.stderr
    assert bob.run(["cat", str(share)]).stdout == "from-alice\n"
    # An IPython shell inside, cell by cell, as the user sees it.
    cells = bob.run_cells(["import os, socket\nprint(os.getpid(), socket.gethostname())", "1/0"])
    assert cells[0].stdout.split() == ["4", "bob-box"]  # after the python (2) and cat (3)
    assert cells[1].error == "ZeroDivisionError"


def test_kernels_in_containers_are_listed_by_host_pid_and_forgotten_when_killed(container_node):
    alice, bob = container_node.container("alice-box"), container_node.container("bob-box")
    hog = alice.start_kernel("hog.ipynb")
    work = bob.start_kernel("work.ipynb")
    assert hog.pid_in_container == work.pid_in_container == 2  # same PID in each container
    assert hog.pid != work.pid
    assert hog.run("import os; print(os.getpid())").strip() == "2"
    hog.run("import jax.numpy as jnp; x = jnp.ones((256, 1024)); x.block_until_ready()")
    work.run(
        "import os; os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'\n"
        "import jax.numpy as jnp; y = jnp.ones((256, 1024)); y.block_until_ready()"
    )
    listed = wait_for(
        "both kernels on the simulated GPU by their host PIDs",
        lambda: (lambda found: found if {hog.pid, work.pid} <= set(found) else None)(
            container_node.listed()
        ),
    )
    assert set(listed) == {hog.pid, work.pid}
    assert listed[hog.pid] > 50 * 2**30  # default mode: 75% of 80 GiB preallocated
    assert listed[work.pid] < 2**30
    host_ns = os.stat("/proc/self/ns/pid").st_ino
    assert {proc.pidns for proc in SimState.read(container_node.state).processes()} == {host_ns}
    # NVML lists the host PIDs, read inside either container, as a real driver does.
    assert set(nvml_inside(bob)) == set(nvml_inside(alice)) == {hog.pid, work.pid}
    assert 2 not in nvml_inside(bob)  # never bob's own kernel's in-container PID
    # A SIGKILLed container's kernel is forgotten: its files stay, its line goes.
    alice.kill()
    assert not psutil.pid_exists(hog.pid)
    wait_for("the registrar forgets alice's kernel", lambda: hog.pid not in container_node.listed())
    assert set(nvml_inside(bob)) == {work.pid}


def test_the_demos_tenant_in_a_container_is_listed_by_host_pid_and_says_both(container_node):
    box = container_node.container("demo-box")
    command = [container_node.python, "-m", "jax_nbmem.simgpu", "tenant", "--fraction", "0.5"]
    done = box.run(command, timeout=240)
    assert done.returncode == 0, done.stderr
    found = re.search(r"kernel PID (\d+) \(host PID; (\d+) in this container\)", done.stdout)
    assert found, done.stdout
    host, own = int(found.group(1)), int(found.group(2))
    assert f"Stop it: kill {own}" in done.stdout
    assert psutil.Process(host).cmdline()[1:3] == ["-m", "ipykernel_launcher"]
    assert container_node.listed()[host] >= 40 * 2**30  # half of the 80 GiB GPU
    assert box.run(["kill", str(own)]).returncode == 0  # the PID it said, in the container
    wait_for("the stopped tenant off the GPU", lambda: host not in container_node.listed())


def test_a_docker_like_container_is_named_by_its_cgroup_to_the_host(container_node):
    box = container_node.container("alice-box", docker_name="jupyter-alice")
    look = box.docker
    inside = box.popen(["sleep", "60"])
    try:
        sleeper = wait_for("the process entered", lambda: [
            c.pid for c in psutil.Process(inside.pid).children(recursive=True)
            if c.name() == "sleep"])[0]  # fmt: skip
        for pid in (box.init_pid, sleeper):  # its PID 1, and what enters it (docker exec)
            assert look.id in open(f"/proc/{pid}/cgroup").read()
        if look.config is not None:
            assert json.loads(look.config.read_text())["Name"] == "/jupyter-alice"
    finally:
        inside.kill()
        inside.wait()
    box.stop()
    assert not look.cgroup.exists()
    assert look.config is None or not look.config.exists()
