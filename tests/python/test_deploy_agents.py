"""The Kubernetes manifests in deploy/, the node side: the agents' RBAC reads EndpointSlices only, their DaemonSet
is privileged only where it must be and shares its mounts with the host, the headless Service strata-agents is the
cache cluster's membership the agents' ConfigMap (strata.toml) names, the operator reaches the agents through the
Service strata-api, and admitted pods reach the agent on their own node through strata-node. The CRDs, samples,
kustomize base and the operator are test_deploy.py; the helpers both share are deploy_manifests.py.

No API server runs here (see ARCHITECTURE.md): these checks are what stands in for `kubectl apply --dry-run=server`.
Each checker returns the problems it finds, and each test also hands it broken copies to show that it finds them.
"""
import copy
import os
import re
import tomllib
from urllib.parse import urlsplit

from deploy_manifests import (NAMESPACE, containers, find, objs, operator_arg, operator_container,
                              operator_run_defaults, rbac_problems, resolves)

# The Secrets the agents read (through env and volumes, resolved by the kubelet): the catalog's URL and key,
# the admin token, the cluster secret.
AGENT_SECRETS = {"strata-catalog", "strata-admin", "strata-cluster"}


# --- The node side: the agents' DaemonSet, RBAC, Services and configuration -----------------------------------


def agent_rbac_problems(objects):
    """The agents read the EndpointSlices of their Service, in their namespace, and nothing else."""
    out = []
    roles = [d for d in objects if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"] == "strata-agent"]
    if [r["kind"] for r in roles] != ["Role"]:
        return [f"not one namespaced Role strata-agent: {[r['kind'] for r in roles]}"]
    (role,) = roles
    out += rbac_problems(role)
    if role["metadata"].get("namespace") != NAMESPACE:
        out.append(f"the agents' Role is in {role['metadata'].get('namespace')}, not {NAMESPACE}")
    granted = {(g, r, v) for rule in role.get("rules") or [] for g in rule.get("apiGroups", [])
               for r in rule.get("resources", []) for v in rule.get("verbs", [])}
    wanted = {("discovery.k8s.io", "endpointslices", v) for v in ("get", "list", "watch")}
    if granted != wanted:
        out.append(f"the agents' Role grants {sorted(granted - wanted)}, lacks {sorted(wanted - granted)}")
    sa = {"kind": "ServiceAccount", "name": "strata-agent", "namespace": NAMESPACE}
    bindings = [b for b in objects if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and any({k: s.get(k) for k in sa} == sa for s in b.get("subjects") or [])]
    refs = [(b["kind"], b["metadata"].get("namespace"), b["roleRef"].get("kind"), b["roleRef"]["name"]) for b in bindings]
    if refs != [("RoleBinding", NAMESPACE, "Role", "strata-agent")]:
        out.append(f"the agents' service account is bound to {refs}, not to its Role alone")
    ds = find(objects, "DaemonSet", "strata-agent")
    if ds["spec"]["template"]["spec"].get("serviceAccountName") != "strata-agent":
        out.append("the DaemonSet does not run as strata-agent")
    return out


def test_the_agents_rbac_reads_endpointslices_only():
    objects = objs()
    assert agent_rbac_problems(objects) == []

    def role(o):
        return find(o, "Role", "strata-agent")

    for breakage in [lambda o: role(o)["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
                     lambda o: role(o)["rules"][0]["verbs"].append("create"),
                     lambda o: role(o)["rules"][0].__setitem__("verbs", ["*"]),
                     lambda o: role(o)["rules"][0].__setitem__("apiGroups", ["*"]),
                     lambda o: role(o)["rules"][0]["verbs"].remove("watch"),
                     lambda o: role(o)["rules"].append({"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}),
                     lambda o: role(o).__setitem__("kind", "ClusterRole"),
                     lambda o: role(o)["metadata"].__setitem__("namespace", "default"),
                     lambda o: o.append({"kind": "ClusterRoleBinding", "metadata": {"name": "x"},
                                         "roleRef": {"kind": "ClusterRole", "name": "view"},
                                         "subjects": [{"kind": "ServiceAccount", "name": "strata-agent",
                                                       "namespace": NAMESPACE}]}),
                     lambda o: find(o, "DaemonSet", "strata-agent")["spec"]["template"]["spec"].pop("serviceAccountName")]:
        bad = copy.deepcopy(objects)
        breakage(bad)
        assert agent_rbac_problems(bad), breakage


def listen_port(args, flag):
    return int(args[args.index(flag) + 1].rpartition(":")[2])


# The containers that make FUSE mounts reaching the node: the agent, and the mounter that holds claims' mounts.
MOUNTING = ("agent", "mounter")


def mounter_problems(objects):
    """Claims' mounts outlive the agent's container: the agents' configuration names a mounter socket, a
    `mounter` container of the same pod serves it, both see the socket's directory as one emptyDir of the pod,
    and the mounter's mounts reach the node as the agent's do."""
    out = []
    ds = find(objects, "DaemonSet", "strata-agent")
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    sock = (agent_config(objects).get("claims") or {}).get("mounter")
    if not sock:
        return ["[claims] mounter is not set: claims' mounts end with the agent's container"]
    by_name = {c["name"]: c for c in pod.get("containers", [])}
    m = by_name.get("mounter")
    if m is None:
        return [f"no mounter container serves {sock}"]
    args = m.get("args") or []
    if args[:1] != ["mounter"] or "--socket" not in args or args[args.index("--socket") + 1] != sock:
        out.append(f"the mounter's args {args} do not serve {sock}")
    for c in (by_name.get("agent") or {}, m):
        mounts = {x["mountPath"]: x for x in c.get("volumeMounts", [])}
        shared = mounts.get(os.path.dirname(sock))
        if shared is None or "emptyDir" not in (volumes.get(shared["name"]) or {}):
            out.append(f"{c.get('name')}: {os.path.dirname(sock)} is not the pod's shared emptyDir")
        state = mounts.get("/var/lib/strata")
        if not state or state.get("mountPropagation") != "Bidirectional" or \
                "hostPath" not in (volumes.get(state["name"]) or {}):
            out.append(f"{c.get('name')}: /var/lib/strata is not the node's, Bidirectional")
    if m.get("image") != (by_name.get("agent") or {}).get("image"):
        out.append("the mounter runs another image than the agent (its `strata mount` must match)")
    return out


def test_claims_mounts_are_made_by_a_mounter_container_that_outlives_the_agents():
    objects = objs()
    assert mounter_problems(objects) == []

    def pod(o):
        return find(o, "DaemonSet", "strata-agent")["spec"]["template"]["spec"]

    def container(o, name):
        return next(c for c in pod(o)["containers"] if c["name"] == name)

    def config(o, f):
        cm = find(o, "ConfigMap", "strata-agent-config")
        cm["data"]["strata.toml"] = f(cm["data"]["strata.toml"])

    for breakage in [
            lambda o: config(o, lambda t: t.replace('mounter = "/run/strata/mounter.sock"', "")),
            lambda o: config(o, lambda t: t.replace("/run/strata/mounter.sock", "/tmp/m.sock")),
            lambda o: pod(o)["containers"].remove(container(o, "mounter")),
            lambda o: container(o, "mounter")["args"].__setitem__(2, "/run/strata/other.sock"),
            lambda o: container(o, "agent")["volumeMounts"].remove(
                next(m for m in container(o, "agent")["volumeMounts"] if m["name"] == "mounter")),
            lambda o: container(o, "mounter")["volumeMounts"][0].pop("mountPropagation"),
            lambda o: container(o, "mounter").__setitem__("image", "busybox")]:
        bad = copy.deepcopy(objects)
        breakage(bad)
        assert mounter_problems(bad), breakage
    # Privileged only where mounts are made.
    bad = copy.deepcopy(objects)
    container(bad, "mounter")["securityContext"]["privileged"] = False
    assert daemonset_problems(find(bad, "DaemonSet", "strata-agent"))


def daemonset_problems(ds):
    """The agents' DaemonSet: privileged only where FUSE and Bidirectional propagation need it, the node's
    /var/lib/strata shared with the host, its identity from the downward API, its own secrets only, ready when
    its API answers."""
    out = []
    pod = ds["spec"]["template"]["spec"]
    for f in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(f):
            out.append(f"{f}: the agent needs none of the node's namespaces but its mounts")
    for c in containers(pod):
        sc = c.get("securityContext") or {}
        if (sc.get("privileged") is True) != (c["name"] in MOUNTING):
            out.append(f"{c['name']}: privileged is {sc.get('privileged')}; only (and always) {MOUNTING}")
        if c["name"] not in MOUNTING and (sc.get("capabilities") or {}).get("add"):
            out.append(f"{c['name']}: adds capabilities")
        for m in c.get("volumeMounts", []):
            if m.get("mountPropagation") == "Bidirectional" and \
                    (c["name"] not in MOUNTING or m["mountPath"] != "/var/lib/strata"):
                out.append(f"{c['name']}: Bidirectional propagation at {m['mountPath']}")
        for e in c.get("env", []):
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref and ref.get("name") not in AGENT_SECRETS:
                out.append(f"{c['name']}: env {e['name']} from Secret {ref.get('name')}, not one of the agent's")
            if "value" in e and re.search(r"TOKEN|SECRET|PASSWORD|CATALOG|KEY", e["name"]):
                out.append(f"{c['name']}: env {e['name']} written into the manifest, not from a Secret")
        for src in c.get("envFrom", []):
            if "secretRef" in src and src["secretRef"].get("name") not in AGENT_SECRETS:
                out.append(f"{c['name']}: envFrom Secret {src['secretRef'].get('name')}")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for v in volumes.values():
        secrets = [v["secret"].get("secretName")] if "secret" in v else []
        secrets += [s["secret"].get("name") for s in (v.get("projected") or {}).get("sources", []) if "secret" in s]
        out += [f"volume {v['name']}: Secret {s}, not one of the agent's" for s in secrets if s not in AGENT_SECRETS]
    agents = [c for c in pod.get("containers", []) if c["name"] == "agent"]
    if len(agents) != 1:
        return out + ["no container named agent"]
    (agent,) = agents
    mounts = {m["mountPath"]: m for m in agent.get("volumeMounts", [])}
    state = mounts.get("/var/lib/strata")
    host = (volumes.get(state["name"]) or {}).get("hostPath") if state else None
    if not host or host.get("path") != "/var/lib/strata" or host.get("type") != "DirectoryOrCreate":
        out.append("/var/lib/strata is not the node's /var/lib/strata (hostPath, DirectoryOrCreate)")
    elif state.get("mountPropagation") != "Bidirectional" or state.get("readOnly"):
        out.append("/var/lib/strata is not mounted read-write with Bidirectional propagation: mounts stay in the pod")
    for m in mounts.values():
        if m is not state and "hostPath" in (volumes.get(m["name"]) or {}):
            out.append(f"another hostPath at {m['mountPath']}")
    secret_mounts = [m for m in mounts.values() if "secret" in (volumes.get(m["name"]) or {})]
    if any(not m.get("readOnly") for m in secret_mounts):
        out.append("a Secret mounted read-write")
    env = {e["name"]: e.get("valueFrom") or {} for e in agent.get("env", [])}
    for name, field in [("POD_IP", "status.podIP"), ("POD_NAMESPACE", "metadata.namespace"), ("NODE_NAME", "spec.nodeName")]:
        if (env.get(name, {}).get("fieldRef") or {}).get("fieldPath") != field:
            out.append(f"{name} is not the downward API's {field}")
    for name, secret, key in [("STRATA_CATALOG", "strata-catalog", "url"), ("STRATA_CATALOG_KEY", "strata-catalog", "key"),
                              ("STRATA_ADMIN_TOKEN", "strata-admin", "token")]:
        ref = env.get(name, {}).get("secretKeyRef") or {}
        if (ref.get("name"), ref.get("key")) != (secret, key):
            out.append(f"{name} is not Secret {secret}'s {key}")
    ports = {p.get("name"): p["containerPort"] for p in agent.get("ports", [])}
    args = agent.get("args") or []
    if args[:1] != ["serve"] or "--api-listen" not in args or "--s3-listen" not in args:
        out.append(f"args {args}")
    else:
        if ports.get("api") != listen_port(args, "--api-listen") or ports.get("s3") != listen_port(args, "--s3-listen"):
            out.append(f"the ports {ports} are not where the agent listens ({args})")
        if args[args.index("--api-listen") + 1].rpartition(":")[0] != "0.0.0.0":
            out.append("the API listens on loopback only: no other agent, probe or Service reaches it")
    probe = (agent.get("readinessProbe") or {}).get("httpGet") or {}
    if probe.get("path") != "/healthz" or probe.get("port") not in ("api", ports.get("api")):
        out.append(f"the readiness probe {probe} is not /healthz on the api port")
    strategy = ds["spec"].get("updateStrategy") or {}
    if strategy.get("type") != "RollingUpdate" or (strategy.get("rollingUpdate") or {}).get("maxUnavailable") != 1:
        out.append(f"updateStrategy {strategy}: one node at a time")
    return out


def test_the_agents_daemonset_is_privileged_only_where_it_must_be_and_shares_its_mounts_with_the_host():
    ds = find(objs(), "DaemonSet", "strata-agent")
    assert daemonset_problems(ds) == []

    def agent(d):
        return next(c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")

    def mount(d, path):
        return next(m for m in agent(d)["volumeMounts"] if m["mountPath"] == path)

    def env(d, name):
        return next(e for e in agent(d)["env"] if e["name"] == name)

    def volume(d, name):
        return next(v for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == name)

    sidecar = {"name": "sidecar", "image": "busybox", "securityContext": {"privileged": True}}
    for breakage in [
            lambda d: d["spec"]["template"]["spec"]["containers"].append(sidecar),
            lambda d: d["spec"]["template"]["spec"].__setitem__("initContainers", [dict(sidecar, name="init")]),
            lambda d: agent(d)["securityContext"].__setitem__("privileged", False),
            lambda d: agent(d).__setitem__("name", "server"),
            lambda d: d["spec"]["template"]["spec"].__setitem__("hostNetwork", True),
            lambda d: mount(d, "/var/lib/strata").pop("mountPropagation"),
            lambda d: mount(d, "/var/lib/strata").__setitem__("mountPropagation", "HostToContainer"),
            lambda d: mount(d, "/etc/strata/cluster").__setitem__("mountPropagation", "Bidirectional"),
            lambda d: volume(d, "state").__setitem__("hostPath", {"path": "/"}),
            lambda d: volume(d, "state").__setitem__("emptyDir", {}) or volume(d, "state").pop("hostPath"),
            lambda d: mount(d, "/etc/strata/cluster").pop("readOnly"),
            lambda d: env(d, "POD_IP").__setitem__("valueFrom", {"fieldRef": {"fieldPath": "status.hostIP"}}),
            lambda d: env(d, "POD_NAMESPACE").pop("valueFrom") and env(d, "POD_NAMESPACE").__setitem__("value", NAMESPACE),
            lambda d: env(d, "STRATA_ADMIN_TOKEN").pop("valueFrom") and env(d, "STRATA_ADMIN_TOKEN").__setitem__("value", "t"),
            lambda d: env(d, "STRATA_CATALOG")["valueFrom"]["secretKeyRef"].__setitem__("name", "postgres"),
            lambda d: agent(d)["env"].append({"name": "X", "valueFrom": {"secretKeyRef": {"name": "strata-operator-token", "key": "token"}}}),
            lambda d: agent(d).__setitem__("envFrom", [{"secretRef": {"name": "cloud-credentials"}}]),
            lambda d: volume(d, "cluster-secret")["secret"].__setitem__("secretName", "kube-root-ca"),
            lambda d: agent(d)["readinessProbe"]["httpGet"].__setitem__("port", "s3"),
            lambda d: agent(d)["readinessProbe"]["httpGet"].__setitem__("path", "/v1/claims"),
            lambda d: agent(d).pop("readinessProbe"),
            lambda d: agent(d)["args"].__setitem__(agent(d)["args"].index("--api-listen") + 1, "127.0.0.1:7070"),
            lambda d: agent(d)["args"].__setitem__(agent(d)["args"].index("--s3-listen") + 1, "0.0.0.0:9001"),
            lambda d: d["spec"]["updateStrategy"].__setitem__("type", "OnDelete")]:
        bad = copy.deepcopy(ds)
        breakage(bad)
        assert daemonset_problems(bad), bad


def agent_config(objects):
    return tomllib.loads(find(objects, "ConfigMap", "strata-agent-config")["data"]["strata.toml"])


def membership_problems(objects):
    """The headless Service's EndpointSlices are the cache cluster's members: it must select the agents' pods
    and name their API port, only ready agents are members, the agents' configuration names it, and the files
    the configuration names are where the DaemonSet mounts them."""
    out = []
    ds = find(objects, "DaemonSet", "strata-agent")
    pod = ds["spec"]["template"]["spec"]
    labels = ds["spec"]["template"]["metadata"].get("labels") or {}
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    ports = {p.get("name"): p["containerPort"] for p in agent.get("ports", [])}
    services = {d["metadata"]["name"]: d for d in objects if d["kind"] == "Service"}

    def selects(svc):
        sel = svc["spec"].get("selector") or {}
        return bool(sel) and all(labels.get(k) == v for k, v in sel.items())

    def port(svc, name):
        return next((p for p in svc["spec"].get("ports", []) if p.get("name") == name), None)

    try:
        config = agent_config(objects)
    except (tomllib.TOMLDecodeError, KeyError, StopIteration) as e:
        return out + [f"the agents' strata.toml: {e!r}"]
    cluster = config.get("cluster") or {}
    if cluster.get("cache") != "kubernetes":
        out.append(f"[cluster] cache = {cluster.get('cache')!r}, not \"kubernetes\"")
    headless = services.get(cluster.get("kube_service"))
    if headless is None:
        return out + [f"[cluster] kube_service = {cluster.get('kube_service')!r} names no Service of the base"]
    if headless["metadata"].get("namespace") != ds["metadata"].get("namespace"):
        out.append("the membership Service is not in the agents' namespace ($POD_NAMESPACE)")
    if headless["spec"].get("clusterIP") != "None":
        out.append("the membership Service is not headless")
    if headless["spec"].get("publishNotReadyAddresses"):
        out.append("not-ready agents would be published as ready members")
    if not selects(headless):
        out.append(f"the membership Service selects {headless['spec'].get('selector')}, not the agents' pods {labels}")
    api = port(headless, "api")
    if api is None or not resolves(api.get("targetPort", api.get("port")), ports, "api"):
        out.append(f"the membership Service has no port named api reaching the agents' API: {headless['spec'].get('ports')}")
    front = services.get("strata-api")
    if front is None:
        out.append("no Service strata-api for the operator and S3 clients")
    else:
        if front["spec"].get("clusterIP") == "None" or front["spec"].get("type", "ClusterIP") != "ClusterIP":
            out.append("strata-api is not a ClusterIP Service")
        if not selects(front):
            out.append("strata-api does not select the agents' pods")
        for name, number in (("api", 7070), ("s3", 9000)):
            p = port(front, name)
            if p is None or p.get("port") != number or not resolves(p.get("targetPort", p["port"]), ports, name):
                out.append(f"strata-api's port {name} is not {number} reaching the agents' {name} port")
    # The files the configuration names are where the DaemonSet puts them.
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: volumes.get(m["name"], {}) for m in agent.get("volumeMounts", [])}
    args = agent.get("args") or []
    conf = args[args.index("--config") + 1] if "--config" in args else None
    if not conf or (mounts.get(os.path.dirname(conf), {}).get("configMap") or {}).get("name") != "strata-agent-config" \
            or os.path.basename(conf) != "strata.toml":
        out.append(f"--config {conf} is not the ConfigMap's strata.toml")
    secret_file = cluster.get("secret_file") or ""
    if (mounts.get(os.path.dirname(secret_file), {}).get("secret") or {}).get("secretName") != "strata-cluster":
        out.append(f"[cluster] secret_file {secret_file!r} is not in the strata-cluster Secret's volume")
    data_dir = config.get("data_dir") or ""
    if not data_dir.startswith("/var/lib/strata/") or "hostPath" not in mounts.get("/var/lib/strata", {}):
        out.append(f"data_dir {data_dir!r} is not on the node's /var/lib/strata (its cache and state would go with the container)")
    cache = config.get("cache") or {}
    if not (cache.get("ram_capacity") and cache.get("disk_capacity")):
        out.append("[cache] sizes the tiers (ram_capacity, disk_capacity): auto would size them to the container")
    return out


def test_the_headless_service_is_the_membership_the_agents_config_names():
    objects = objs()
    config = agent_config(objects)
    assert config["cluster"]["cache"] == "kubernetes"
    assert config["cluster"]["kube_service"] == "strata-agents"
    assert membership_problems(objects) == []

    def svc(o, name):
        return find(o, "Service", name)

    def config_map(o):
        return find(o, "ConfigMap", "strata-agent-config")["data"]

    def edit_toml(old, new):
        def f(o):
            assert old in config_map(o)["strata.toml"], old
            config_map(o)["strata.toml"] = config_map(o)["strata.toml"].replace(old, new)
        return f

    for i, breakage in enumerate([
            lambda o: svc(o, "strata-agents")["spec"]["selector"].__setitem__("app.kubernetes.io/name", "strata-operator"),
            lambda o: svc(o, "strata-agents")["spec"].pop("selector"),
            lambda o: svc(o, "strata-agents")["spec"]["ports"][0].__setitem__("name", "http"),
            lambda o: svc(o, "strata-agents")["spec"]["ports"][0].__setitem__("targetPort", "s3"),
            lambda o: svc(o, "strata-agents")["spec"].pop("clusterIP"),
            lambda o: svc(o, "strata-agents")["spec"].__setitem__("publishNotReadyAddresses", True),
            lambda o: svc(o, "strata-agents")["metadata"].__setitem__("namespace", "default"),
            lambda o: svc(o, "strata-api")["spec"].__setitem__("clusterIP", "None"),
            lambda o: svc(o, "strata-api")["spec"]["ports"].pop(),
            lambda o: o.remove(svc(o, "strata-api")),
            edit_toml('kube_service = "strata-agents"', 'kube_service = "strata-agent"'),
            edit_toml('cache = "kubernetes"', 'cache = "static"'),
            edit_toml('secret_file = "/etc/strata/cluster/secret"', 'secret_file = "/etc/strata/cluster-secret"'),
            edit_toml('data_dir = "/var/lib/strata/data"', 'data_dir = "/data"'),
            edit_toml('ram_capacity = ', 'ram_capacity = \n'),  # no longer TOML
            lambda o: find(o, "DaemonSet", "strata-agent")["spec"]["template"]["metadata"]["labels"].__setitem__(
                "app.kubernetes.io/name", "agent")]):
        bad = copy.deepcopy(objects)
        breakage(bad)
        assert membership_problems(bad), (i, breakage)


def operator_address_problems(objects):
    """The operator's STRATA_AGENT is a Service of the base, in the namespace it names, on a port it has."""
    dep = find(objects, "Deployment", "strata-operator")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c.get("env", [])}
    url = urlsplit(env.get("STRATA_AGENT", {}).get("value", ""))
    name, _, rest = (url.hostname or "").partition(".")
    namespace = rest.split(".")[0] or dep["metadata"]["namespace"]
    svc = next((d for d in objects if d["kind"] == "Service" and d["metadata"]["name"] == name
                and d["metadata"].get("namespace") == namespace), None)
    if svc is None:
        return [f"STRATA_AGENT {url.geturl()!r} names no Service of the base"]
    if svc["spec"].get("clusterIP") == "None":
        return [f"STRATA_AGENT names the headless {name}: one agent's address at a time, by DNS round robin"]
    if url.port not in [p.get("port") for p in svc["spec"].get("ports", [])]:
        return [f"STRATA_AGENT's port {url.port} is not a port of {name}"]
    return []


def test_the_operator_reaches_the_agents_through_a_service_of_the_base():
    objects = objs()

    def agent_url(o, url):
        c = find(o, "Deployment", "strata-operator")["spec"]["template"]["spec"]["containers"][0]
        next(e for e in c["env"] if e["name"] == "STRATA_AGENT")["value"] = url

    for url, ok in [("http://strata-api.strata-system:7070", True),
                    ("http://strata-api.strata-system.svc.cluster.local:7070", True),
                    ("http://strata-api.strata-system:9999", False),
                    ("http://strata-agents.strata-system:7070", False),
                    ("http://strata-api.default:7070", False),
                    ("http://strata-agent.strata-system:7070", False)]:
        o = copy.deepcopy(objects)
        agent_url(o, url)
        assert (operator_address_problems(o) == []) == ok, (url, operator_address_problems(o))
    assert operator_address_problems(objects) == []


# --- Pods declare their data: the agent on each pod's node -------------------------------------------------


def node_agent_problems(objects, defaults):
    """An admitted pod's STRATA_AGENT (--node-agent) is a Service of the base that reaches the agent on the
    pod's own node: a ClusterIP Service with internalTrafficPolicy Local selecting the agents' pods, at their
    API port. And the agents' Service the operator reads status.nodes from (--agents-service, in its own
    namespace) is the membership Service the agents' configuration names."""
    out = []
    dep = find(objects, "Deployment", "strata-operator")
    url = urlsplit(operator_arg(objects, "node-agent", defaults) or "")
    name, _, rest = (url.hostname or "").partition(".")
    namespace = rest.split(".")[0] or dep["metadata"]["namespace"]
    svc = next((d for d in objects if d["kind"] == "Service" and d["metadata"]["name"] == name
                and d["metadata"].get("namespace") == namespace), None)
    ds = find(objects, "DaemonSet", "strata-agent")
    labels = ds["spec"]["template"]["metadata"].get("labels") or {}
    agent = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    ports = {p.get("name"): p["containerPort"] for p in agent.get("ports", [])}
    if svc is None:
        out.append(f"--node-agent {url.geturl()!r} names no Service of the base")
    else:
        spec = svc["spec"]
        if spec.get("clusterIP") == "None" or spec.get("type", "ClusterIP") != "ClusterIP":
            out.append(f"{name} is not a ClusterIP Service")
        if spec.get("internalTrafficPolicy") != "Local":
            out.append(f"{name}'s internalTrafficPolicy is {spec.get('internalTrafficPolicy', 'Cluster')!r}: a pod "
                       "would reach any node's agent, not the one next to it")
        sel = spec.get("selector") or {}
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            out.append(f"{name} selects {sel}, not the agents' pods {labels}")
        p = next((p for p in spec.get("ports", []) if p.get("port") == url.port), None)
        if p is None or p.get("name") != "api" or not resolves(p.get("targetPort", p["port"]), ports, "api"):
            out.append(f"{name} has no port {url.port} named api reaching the agents' API port")
    watched = operator_arg(objects, "agents-service", defaults)
    kube_service = (agent_config(objects).get("cluster") or {}).get("kube_service")
    if watched != kube_service or not any(d["kind"] == "Service" and d["metadata"]["name"] == watched
                                          and d["metadata"].get("namespace") == dep["metadata"]["namespace"]
                                          for d in objects):
        out.append(f"--agents-service {watched!r} is not the agents' membership Service {kube_service!r} in the "
                   "operator's namespace")
    return out


def test_admitted_pods_reach_the_agent_on_their_own_node_through_strata_node():
    objects, defaults = objs(), operator_run_defaults()
    assert node_agent_problems(objects, defaults) == []
    node = find(objects, "Service", "strata-node")
    assert node["spec"]["internalTrafficPolicy"] == "Local"
    # The other checks of the agents' Services still hold with strata-node beside them.
    assert membership_problems(objects) == [] and operator_address_problems(objects) == []

    def svc(o):
        return find(o, "Service", "strata-node")

    def set_arg(flag, value):
        return lambda o: operator_container(o)["args"].extend([flag, value])

    for breakage in [lambda o: svc(o)["spec"].pop("internalTrafficPolicy"),
                     lambda o: svc(o)["spec"].__setitem__("internalTrafficPolicy", "Cluster"),
                     lambda o: svc(o)["spec"]["selector"].__setitem__("app.kubernetes.io/name", "strata-operator"),
                     lambda o: svc(o)["spec"]["ports"][0].__setitem__("name", "http"),
                     lambda o: svc(o)["spec"]["ports"][0].__setitem__("port", 7071),
                     lambda o: svc(o)["spec"]["ports"][0].__setitem__("targetPort", "s3"),
                     lambda o: svc(o)["spec"].__setitem__("clusterIP", "None"),
                     lambda o: o.remove(svc(o)),
                     set_arg("--node-agent", "http://strata-api.strata-system:7070"),
                     set_arg("--node-agent", "http://strata-node.default:7070"),
                     set_arg("--agents-service", "strata-api")]:
        bad = copy.deepcopy(objects)
        breakage(bad)
        assert node_agent_problems(bad, defaults), breakage
