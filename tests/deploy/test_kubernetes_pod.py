"""The agent's pod as rendered: exactly the privileges it uses, wired to its Service and scrape.

And the Zero to JupyterHub values beside it, which no tool here can render (helm and the chart
are not on the registries): checked only to agree with the overlay and the hub config.
"""

from __future__ import annotations

import ast
import re

import pytest
import yaml

from tests.deploy.kubernetes import KUBERNETES, containers, one, render
from tests.deploy.prometheus import REPO, RULES

ROUTES = {"/healthz", "/metrics"}  # what the exporter serves (tests/cli/test_exporter_health)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return render(tmp_path_factory.mktemp("base"), None)


@pytest.fixture(scope="module")
def z2jh(tmp_path_factory):
    return render(tmp_path_factory.mktemp("z2jh"), "z2jh")


def test_only_the_agent_s_own_namespace_allows_the_host_s_pid_namespace(base):
    namespace = one(base, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    pod = one(base, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert {o["metadata"].get("namespace") for o in base} <= {None, "jax-nbmem"}
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    # The share directory is the pod's own; the host's paths it reads are read-only.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["share"]
    for container in pod["containers"]:
        for mount in container["volumeMounts"]:
            if "hostPath" in volumes[mount["name"]]:
                assert mount.get("readOnly") is True, mount


# What each container keeps: the agent reads other users' /proc/PID/{ns,fd,environ} (the
# ptrace check and the files' own modes); tests/deploy/test_agent_privileges.py runs it so.
KEPT = {"agent": ["SYS_PTRACE", "DAC_READ_SEARCH"], "culler": ["SYS_PTRACE"]}


def test_no_container_is_privileged_and_each_keeps_only_what_it_needs(base):
    for name, container in containers(base).items():
        context = container["securityContext"]
        assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"], "add": KEPT[name]}, name


def test_each_added_capability_says_why():
    lines = (KUBERNETES / "base" / "daemonset.yaml").read_text().splitlines()
    kept = {f"- {cap}" for caps in KEPT.values() for cap in caps}
    added = [i for i, line in enumerate(lines) if line.strip() in kept]
    assert len(added) == sum(len(caps) for caps in KEPT.values())
    for i in added:
        assert lines[i - 1].strip().startswith("#"), lines[i - 1]


def test_every_gpu_is_seen_and_none_is_taken_from_users(base):
    for container in containers(base).values():
        env = {v["name"]: v.get("value") for v in container["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
        resources = container["resources"]
        assert set(resources) == {"requests", "limits"}
        for part in resources.values():
            assert set(part) == {"cpu", "memory"}  # no nvidia.com/gpu


def test_probes_ask_routes_the_exporter_serves_on_ports_the_container_has(base):
    agent = containers(base)["agent"]
    ports = {p["name"] for p in agent["ports"]}
    probes = [k for k in agent if k.endswith("Probe")]
    assert sorted(probes) == ["livenessProbe", "readinessProbe", "startupProbe"]
    for kind in probes:
        get = agent[kind]["httpGet"]
        assert get["path"] in ROUTES and get["port"] in ports, kind
    assert {agent[k]["httpGet"]["path"] for k in probes} == {"/healthz"}
    # The culler serves nothing off loopback (`cull --listen` refuses any other address), so
    # there is nothing a kubelet's probe could ask: no port, no probe.
    culler = containers(base)["culler"]
    assert "ports" not in culler and not [k for k in culler if k.endswith("Probe")]


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("overlay", [None, "z2jh", "tls"], ids=lambda o: o or "base")
def test_the_agent_listens_for_kernels_where_users_pods_are_told_to_look(overlay, tmp_path):
    objects = render(tmp_path, overlay)
    agent, culler = containers(objects)["agent"], containers(objects)["culler"]
    args = agent["args"]
    host, _, port = _option(args, "--agent-listen").rpartition(":")
    assert host == "0.0.0.0"  # the pod's address, where the hostPort's NAT delivers
    (declared,) = [p for p in agent["ports"] if p["name"] == "agent"]
    assert declared["containerPort"] == declared["hostPort"] == int(port)
    values = yaml.safe_load((KUBERNETES / "z2jh-values.yaml").read_text())
    assert values["singleuser"]["extraEnv"]["JAX_NBMEM_AGENT_PORT"] == port
    # Pods named through the API, for the node the pod runs on; a pod that cannot refuses.
    assert _option(args, "--kubernetes") == "on"
    assert _option(args, "--pod-names-visible") == "own"
    env = {v["name"]: v for v in agent["env"]}
    assert env["JAX_NBMEM_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # The culler would refuse a --listen off loopback: the agent serves its count.
    assert "--listen" not in culler["args"]
    assert _option(culler["args"], "--share-dir") == _option(args, "--share-dir")


def test_the_service_and_the_service_monitor_reach_the_agent_s_metrics(base):
    template = one(base, "DaemonSet")["spec"]["template"]
    service = one(base, "Service")
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (agent,) = [c for c in template["spec"]["containers"] if c["name"] == "agent"]
    declared = {p["name"] for p in agent["ports"]}
    assert declared == {"metrics", "agent"}
    # Kernels dial their own node's address (the hostPort), never a Service.
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"]
    monitor = one(base, "ServiceMonitor")
    selects = monitor["spec"]["selector"]["matchLabels"]
    assert selects.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    relabel = endpoint["relabelings"]
    assert [r["replacement"] for r in relabel if r.get("targetLabel") == "job"] == ["jax_nbmem"]
    drops = [r for r in relabel if r["action"] == "labeldrop"]
    assert [d["regex"] for d in drops] == ["(pod|namespace|container)"]
    assert 'absent(up{job="jax_nbmem"})' in RULES.read_text()  # the job the rules know


def _admitted(policy: dict) -> dict[str, list[dict]]:
    """The NetworkPolicy's ingress peers by port name."""
    peers: dict[str, list[dict]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            peers.setdefault(port["port"], []).extend(rule["from"])
    return peers


def test_the_network_policy_admits_prometheus_to_the_metrics_and_users_pods_to_the_agent(
    base, z2jh
):
    pod_labels = one(base, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    policy = one(base, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    singleuser = {"matchLabels": {"component": "singleuser-server"}}  # KubeSpawner's, in z2jh
    monitoring = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert _admitted(policy) == {
        "metrics": [{"namespaceSelector": monitoring}],
        "agent": [{"namespaceSelector": {}, "podSelector": singleuser}],  # any namespace's
    }
    jhub = {"matchLabels": {"kubernetes.io/metadata.name": "jhub"}}
    assert _admitted(one(z2jh, "NetworkPolicy")) == {
        "metrics": [{"namespaceSelector": monitoring}],
        "agent": [{"namespaceSelector": jhub, "podSelector": singleuser}],  # the hub's only
    }
    # And z2jh's own policy on users' pods lets them out to the agent's pod and port.
    values = yaml.safe_load((KUBERNETES / "z2jh-values.yaml").read_text())
    (rule,) = values["singleuser"]["networkPolicy"]["egress"]
    (peer,) = rule["to"]
    namespace = one(base, "Namespace")["metadata"]["name"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    assert peer["podSelector"]["matchLabels"].items() <= pod_labels.items()
    agent = containers(base)["agent"]
    (port,) = [p["containerPort"] for p in agent["ports"] if p["name"] == "agent"]
    assert rule["ports"] == [{"port": port, "protocol": "TCP"}]


def test_the_agent_may_only_read_pods(base):
    role = one(base, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = one(base, "ClusterRoleBinding")
    pod = one(base, "DaemonSet")["spec"]["template"]["spec"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "jax-nbmem"}
    ]


def test_the_z2jh_culler_talks_to_the_hub_with_the_token_of_its_secret(z2jh):
    culler = containers(z2jh)["culler"]
    args = culler["args"]
    assert args[args.index("--hub-url") + 1] == "http://proxy-public.jhub.svc.cluster.local"
    env = {v["name"]: v for v in culler["env"]}
    reference = env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"]
    secret = one(z2jh, "Secret")
    assert reference["name"] == secret["metadata"]["name"] and reference["key"] in secret["data"]
    assert env["JUPYTERHUB_API_URL"]["value"] == "http://hub.jhub.svc.cluster.local:8081/hub/api"
    template = one(z2jh, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    namespace = one(z2jh, "Namespace")["metadata"]["labels"]
    for access in ("hub", "proxy-http"):  # z2jh's NetworkPolicies: the hub's API, the proxy
        assert template[f"hub.jupyter.org/network-access-{access}"] == "true"
        assert namespace[f"hub.jupyter.org/network-access-{access}"] == "true"


def _hub_config_scopes() -> list[str]:
    """The culler role's scopes in docs/jupyterhub_config.py (the hub tests run that file)."""
    tree = ast.parse((REPO / "docs" / "jupyterhub_config.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if "scopes" in keys:
                return ast.literal_eval(node.values[keys.index("scopes")])
    raise AssertionError("no scopes in docs/jupyterhub_config.py")


def test_the_z2jh_values_register_the_culler_as_the_hub_config_does():
    values = yaml.safe_load((KUBERNETES / "z2jh-values.yaml").read_text())
    hub = values["hub"]
    assert set(hub["services"]) == {"jax-nbmem-culler"}
    assert not {"command", "url"} & set(hub["services"]["jax-nbmem-culler"])  # external
    role = hub["loadRoles"]["jax-nbmem-culler"]
    assert role["services"] == ["jax-nbmem-culler"]
    assert role["scopes"] == _hub_config_scopes()
    assert hub["networkPolicy"]["interNamespaceAccessLabels"] == "accept"
    assert values["proxy"]["chp"]["networkPolicy"]["interNamespaceAccessLabels"] == "accept"
    user = values["singleuser"]
    host = user["extraEnv"]["JAX_NBMEM_AGENT_HOST"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert host == "status.hostIP"
    assert re.fullmatch(r"[0-9]+", user["extraEnv"]["JAX_NBMEM_AGENT_PORT"])
    (config,) = user["extraFiles"].values()
    assert config["mountPath"] == "/etc/ipython/ipython_kernel_config.json"
    assert config["data"] == {"InteractiveShellApp": {"extensions": ["jax_nbmem"]}}


def test_the_agent_s_private_cgroup_namespace_still_names_the_pod_and_container():
    # In the agent's container (cgroup v2: a cgroup namespace of its own) another pod's
    # /proc/PID/cgroup is relative to the agent's own cgroup: it starts with "/..".
    from jax_nbmem.agent.cgroups import container_from_cgroup

    uid, cid = "0d2a4c1e-5b6f-4a3b-9c8d-7e6f5a4b3c2d", "ab" * 32
    seen = (f"0::/../../kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}"
            f".slice/cri-containerd-{cid}.scope\n")  # fmt: skip
    container, path = container_from_cgroup(seen)
    assert path.startswith("/../../") and container is not None
    assert (container.id, container.runtime, container.pod_uid) == (cid, "containerd", uid)
