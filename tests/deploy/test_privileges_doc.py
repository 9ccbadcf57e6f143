"""docs/security.md's "Privileges" is the one account of the node agent's privileges, and true.

Every setting its table names in backticks is looked up in what ships: a ``Key=Value`` in the
unit (``deploy/jax-nbmem-exporter.service``), a ``--flag value`` in the arguments the unit is
started with (``deploy/jax-nbmem-exporter.env``) or the DaemonSet's ``agent`` container, a
``key: value`` in that container or its pod (``deploy/kubernetes/base/daemonset.yaml``). The
rows an administrator signs off (user, capabilities, share directory, ports) must each say
something checked for both; and what the rows mean (which capabilities, which folder is
writable, which address) is checked against the files as a whole. The other pages link to the
section instead of saying it again.
"""

from __future__ import annotations

import ipaddress
import re
import shlex

import pytest
import yaml

from jax_nbmem.agent.server import SOCKET_NAME
from tests.deploy.prometheus import REPO

SECURITY = REPO / "docs" / "security.md"
UNIT = REPO / "deploy" / "jax-nbmem-exporter.service"
ENV = REPO / "deploy" / "jax-nbmem-exporter.env"
DAEMONSET = REPO / "deploy" / "kubernetes" / "base" / "daemonset.yaml"
NETWORKPOLICY = REPO / "deploy" / "kubernetes" / "base" / "networkpolicy.yaml"
SIGNED_OFF = ("user", "`CAP_SYS_PTRACE`", "`CAP_DAC_READ_SEARCH`", "every other capability",
              "the share directory", "metrics port", "the agent's port for kernels")  # fmt: skip
# What the pages that link to the section used to restate (issue 51: three accounts).
RESTATED = (r"DynamicUser", r"capabilit\w* dropped but", r"\b\d\.\d OK\b", r"CAP_DAC_READ_SEARCH",
            r"systemd-analyze security", r"ReadWritePaths", r"runAsUser")  # fmt: skip


def _table() -> dict[str, tuple[str, str]]:
    """The Privileges table: its first cell → (the unit's cell, the DaemonSet's cell)."""
    text = SECURITY.read_text()
    section = text.split("\n## Privileges\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert rows[0].split("|")[2:4] == [" the systemd unit ", " the DaemonSet's `agent` container "]
    table = {}
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        table[cells[0]] = (cells[1], cells[2])
    return table


def _unit_lines() -> set[str]:
    return {line.strip() for line in UNIT.read_text().splitlines() if "=" in line
            and not line.lstrip().startswith("#")}  # fmt: skip


def _unit_setting(key: str) -> list[str]:
    return [line.partition("=")[2] for line in _unit_lines() if line.partition("=")[0] == key]


def _unit_args() -> list[str]:
    """The unit's exporter arguments: the env file's first, uncommented, JAX_NBMEM_EXPORTER_ARGS."""
    for line in ENV.read_text().splitlines():
        if line.startswith("JAX_NBMEM_EXPORTER_ARGS="):
            return shlex.split(line.partition("=")[2])[0].split()
    raise AssertionError(f"{ENV} sets no JAX_NBMEM_EXPORTER_ARGS")


def _pod_spec() -> dict:
    return yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]


def _agent() -> dict:
    (agent,) = [c for c in _pod_spec()["containers"] if c["name"] == "agent"]
    return agent


def _searchable(node):
    """``node`` with each ``env`` list turned into a mapping (name → value), to look keys up in."""
    if isinstance(node, dict):
        return {k: (_env(v) if k == "env" else _searchable(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_searchable(item) for item in node]
    return node


def _env(items):
    return {item["name"]: item.get("value") for item in items}


def _has(node, key, value) -> bool:
    """Whether some mapping in ``node`` holds ``key`` with exactly ``value``."""
    if isinstance(node, dict):
        if key in node and node[key] == value:
            return True
        return any(_has(v, key, value) for v in node.values())
    if isinstance(node, list):
        return any(_has(item, key, value) for item in node)
    return False


def _flag_given(args: list[str], token: str) -> bool:
    flag, _, value = token.partition(" ")
    if flag not in args:
        return False
    return not value or args[args.index(flag) + 1] == value


def _checked_unit(token: str) -> bool:
    """Check one backticked token of the unit's column; False: it says nothing checkable."""
    if re.fullmatch(r"[A-Z][A-Za-z]+=\S.*", token):
        assert token in _unit_lines(), f"the unit has no line {token!r}"
        return True
    if token.startswith("--"):
        assert _flag_given(_unit_args(), token), f"{ENV} does not start it with {token!r}"
        return True
    if token == SOCKET_NAME:
        return True
    return False


def _checked_daemonset(token: str) -> bool:
    """Check one backticked token of the DaemonSet's column; False: nothing checkable."""
    if token.startswith("--"):
        assert _flag_given(_agent()["args"], token), f"the agent container has no {token!r}"
        return True
    if re.fullmatch(r"\w+: \S.*", token):
        ((key, value),) = yaml.safe_load(token).items()
        where = _searchable({**_pod_spec(), "containers": [_agent()]})
        assert _has(where, key, value), f"the agent's pod has no {token!r}"
        return True
    return False


def test_every_setting_the_table_names_is_what_ships():
    table = _table()
    assert set(SIGNED_OFF) <= set(table), set(SIGNED_OFF) - set(table)
    for what, (unit_cell, ds_cell) in table.items():
        checked_unit = [t for t in re.findall(r"`([^`]+)`", unit_cell) if _checked_unit(t)]
        checked_ds = [t for t in re.findall(r"`([^`]+)`", ds_cell) if _checked_daemonset(t)]
        if what in SIGNED_OFF and not what.startswith("`CAP_"):  # those two share one cell's lines
            assert checked_unit, f"{what}: the unit's cell says nothing checked: {unit_cell}"
            assert checked_ds, f"{what}: the DaemonSet's cell says nothing checked: {ds_cell}"


def test_the_capabilities_kept_are_exactly_the_table_s():
    kept = {
        what.strip("`")
        for what, (unit, ds) in _table().items()
        if what.startswith("`CAP_") and unit.startswith("kept") and ds.startswith("kept")
    }
    assert kept == {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}
    for key in ("CapabilityBoundingSet", "AmbientCapabilities"):
        (value,) = _unit_setting(key)
        assert set(value.split()) == kept, (key, value)
    context = _agent()["securityContext"]
    assert context["capabilities"]["drop"] == ["ALL"]
    assert {"CAP_" + name for name in context["capabilities"]["add"]} == kept
    assert context["runAsUser"] == 0 and _unit_setting("User") == ["root"]


def test_the_share_directory_is_the_one_writable_folder_and_the_one_the_agent_is_given():
    (share,) = _unit_setting("ReadWritePaths")
    assert _flag_given(_unit_args(), f"--share-dir {share}")
    assert _unit_setting("ProtectSystem") == ["strict"]
    agent = _agent()
    (mount,) = [m for m in agent["volumeMounts"] if m["mountPath"] == share]
    assert not mount.get("readOnly") and _flag_given(agent["args"], f"--share-dir {share}")
    (volume,) = [v for v in _pod_spec()["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume, volume  # the pod's own, as the table says
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert all(m.get("readOnly") for m in agent["volumeMounts"]
               if m["mountPath"] not in (share, "/tmp"))  # fmt: skip


def test_the_exposure_the_table_states():
    unit, daemonset = _table()["metrics port"]
    listen = _unit_args()[_unit_args().index("--listen") + 1]
    assert ipaddress.ip_address(listen.rpartition(":")[0]).is_loopback and "loopback" in unit
    assert "--agent-listen" not in _unit_args() and "Unix socket" in _table()[
        "the agent's port for kernels"][0]  # fmt: skip
    # Off loopback in the pod: only the namespace the table names reaches the metrics port.
    assert "--insecure" in _agent()["args"]
    (namespace,) = re.findall(r"the namespace `([^`]+)`", daemonset)
    policy = yaml.safe_load(NETWORKPOLICY.read_text())["spec"]
    metrics_rules = [r for r in policy["ingress"] if {"port": "metrics", "protocol": "TCP"}
                     in r["ports"]]  # fmt: skip
    assert [r["from"] for r in metrics_rules] == [
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}]
    ]


def test_the_section_says_loopback_is_no_boundary_between_local_users():
    text = " ".join(SECURITY.read_text().replace("**", "").split())
    assert "Loopback is not a privacy boundary on a shared machine. Every local user reads" in text


@pytest.mark.parametrize(
    "page", ["docs/metrics.md", "docs/containers.md", "README.md", "docs/shared-node.md",
             "docs/jupyterhub.md", "docs/getting-started.md", "docs/troubleshooting.md",
             "docs/upgrade.md"],
)  # fmt: skip
def test_other_pages_link_to_the_account_instead_of_restating_it(page):
    text = (REPO / page).read_text()
    for pattern in RESTATED:
        found = re.search(pattern, text)
        assert found is None, f"{page} restates the privileges ({found.group(0)!r}): link instead"
    if page in ("docs/metrics.md", "docs/containers.md"):
        assert "(security.md#privileges)" in text
