"""The shared helpers of test_deploy.py and test_deploy_agents.py, the tests of the Kubernetes manifests in deploy/:
loading what `kubectl apply -k deploy/` applies (the kustomize base, deploy/kustomization.yaml, and the files it
lists) and the samples, the CRDs' schemas, the structural checks that stand in for the API server's validation,
the least-privilege checker every Role and ClusterRole goes through, and what the operator's Deployment runs
with (its args, and the defaults `strata operator run --help` shows).

A plain module, not a test module, so that both test files import these without pytest collecting anything twice.
"""
import functools
import glob
import os
import re
import subprocess

import yaml

from conftest import STRATA

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
KUSTOMIZATION = "kustomization.yaml"
NAMESPACE = "strata-system"


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def manifests():
    """deploy/'s top-level manifests: every .yaml there but the kustomize base itself (not the samples)."""
    names = (os.path.basename(p) for p in glob.glob(os.path.join(DEPLOY, "*.yaml")))
    return sorted(n for n in names if n != KUSTOMIZATION)


def kustomization():
    (k,) = docs(os.path.join(DEPLOY, KUSTOMIZATION))
    return k


def applied():
    """Every document `kubectl apply -k deploy/` applies: those of the files the base lists, in its order."""
    out = []
    for name in kustomization()["resources"]:
        out += [(name, d) for d in docs(os.path.join(DEPLOY, name))]
    return out


def objs():
    return [d for _, d in applied()]


def find(objects, kind, name):
    return next(d for d in objects if d["kind"] == kind and d["metadata"]["name"] == name)


def pod_spec(d):
    """The pod spec of a workload (or a Pod), else None."""
    if d.get("kind") == "Pod":
        return d.get("spec")
    if d.get("kind") in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        return d.get("spec", {}).get("template", {}).get("spec")
    return None


def containers(pod):
    return pod.get("initContainers", []) + pod.get("containers", [])


def crd_schemas():
    out = {}
    for _, d in applied():
        if d["kind"] == "CustomResourceDefinition":
            for v in d["spec"]["versions"]:
                out[(d["spec"]["group"] + "/" + v["name"], d["spec"]["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    return out


def rbac_problems(role):
    """What breaks least privilege in a Role or ClusterRole, whoever it is for."""
    out = []
    for rule in role.get("rules") or []:
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            if "*" in rule.get(field, []):
                out.append(f"wildcard in {field}: {rule}")
        if rule.get("nonResourceURLs"):
            out.append(f"nonResourceURLs: {rule}")
        if any(r == "secrets" or r.startswith("secrets/") for r in rule.get("resources", [])):
            out.append(f"secrets (the kubelet resolves them; no RBAC on secrets): {rule}")
        if {"escalate", "bind", "impersonate"} & set(rule.get("verbs", [])):
            out.append(f"escalate, bind or impersonate: {rule}")
    return out


# --- Structure: what the API server's validation would refuse ------------------------------------------------

CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                  "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# IANA_SVC_NAME: what a named port must be (lower case letters, digits and single dashes, at least one letter,
# at most 15 characters).
PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9]|-(?!-))*[a-z0-9]$|^[a-z]$")


def port_name_problems(where, name):
    if len(name) > 15 or not PORT_NAME.match(name):
        return [f"{where}: port name {name!r} is not an IANA service name of at most 15 characters"]
    return []


def structure_problems(d):
    """What the API server would refuse in document `d` (a subset of its validation: names, namespaces, pod
    specs, Services), since no API server runs here."""
    out = []
    if not d.get("apiVersion") or not d.get("kind"):
        return [f"no apiVersion or kind: {d}"]
    meta = d.get("metadata") or {}
    where = f"{d['kind']}/{meta.get('name')}"
    name = meta.get("name")
    if not name or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        out.append(f"{where}: metadata.name is not a DNS subdomain")
    if d["kind"] in CLUSTER_SCOPED and meta.get("namespace"):
        out.append(f"{where}: cluster-scoped but names a namespace")
    if d["kind"] not in CLUSTER_SCOPED and not meta.get("namespace"):
        out.append(f"{where}: names no namespace (nothing sets one for it)")
    pod = pod_spec(d)
    if pod is not None:
        cs = containers(pod)
        if not pod.get("containers"):
            out.append(f"{where}: no containers")
        names = [c.get("name") for c in cs]
        if len(set(names)) != len(names) or not all(names):
            out.append(f"{where}: container names not unique: {names}")
        volumes = [v.get("name") for v in pod.get("volumes", [])]
        if len(set(volumes)) != len(volumes):
            out.append(f"{where}: volume names not unique: {volumes}")
        for v in pod.get("volumes", []):
            if len([k for k in v if k != "name"]) != 1:
                out.append(f"{where}: volume {v.get('name')} has not exactly one source")
        pod_ports = []
        for c in cs:
            cw = f"{where} container {c.get('name')}"
            if not c.get("image"):
                out.append(f"{cw}: no image")
            ports = c.get("ports", [])
            for p in ports:
                if not isinstance(p.get("containerPort"), int) or not 0 < p["containerPort"] < 65536:
                    out.append(f"{cw}: containerPort {p.get('containerPort')!r}")
                if "name" in p:
                    out += port_name_problems(cw, p["name"])
                    pod_ports.append(p["name"])
            paths = []
            for m in c.get("volumeMounts", []):
                if m.get("name") not in volumes:
                    out.append(f"{cw}: volumeMount {m.get('name')} names no volume of the pod")
                paths.append(m.get("mountPath"))
                if m.get("mountPropagation") not in (None, "None", "HostToContainer", "Bidirectional"):
                    out.append(f"{cw}: mountPropagation {m['mountPropagation']!r}")
            if len(set(paths)) != len(paths):
                out.append(f"{cw}: two mounts at one path: {paths}")
            for e in c.get("env", []):
                if not e.get("name") or ("value" in e and "valueFrom" in e):
                    out.append(f"{cw}: env {e} has both a value and valueFrom, or no name")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = (c.get(probe) or {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in {p.get("name") for p in ports}:
                    out.append(f"{cw}: {probe} on port {port!r}, which the container does not name")
        if len(set(pod_ports)) != len(pod_ports):
            out.append(f"{where}: port names not unique in the pod: {pod_ports}")
        spec = d.get("spec", {})
        if "selector" in spec:
            labels = spec["template"].get("metadata", {}).get("labels", {})
            sel = spec["selector"].get("matchLabels") or {}
            if not sel or any(labels.get(k) != v for k, v in sel.items()):
                out.append(f"{where}: the selector {sel} does not select its template's labels {labels}")
    if d["kind"] == "Service":
        ports = d.get("spec", {}).get("ports") or []
        names = [p.get("name") for p in ports]
        if not ports:
            out.append(f"{where}: no ports")
        if len(ports) > 1 and (not all(names) or len(set(names)) != len(names)):
            out.append(f"{where}: a Service's ports must all be named, uniquely, when it has more than one")
        for p in ports:
            if p.get("name"):
                out += port_name_problems(where, p["name"])
            if not isinstance(p.get("port"), int):
                out.append(f"{where}: port {p}")
    return out


def all_documents():
    """What -k applies and the samples."""
    out = applied()
    for p in sorted(glob.glob(os.path.join(DEPLOY, "samples", "*.yaml"))):
        out += [("samples/" + os.path.basename(p), d) for d in docs(p)]
    return out


# --- Ports, and what the operator's Deployment runs with -----------------------------------------------------


def resolves(target, ports, name=None):
    """Whether a Service's targetPort (a name or a number) is one of the pod's container ports {name: number}
    (the one named `name`, when given)."""
    number = ports.get(target, target)
    if name is not None:
        return name in ports and number == ports[name]
    return number in ports.values()


@functools.lru_cache(maxsize=None)
def operator_run_defaults():
    """The defaults `strata operator run --help` shows, by flag name without the dashes (webhook-cert,
    webhook-key, node-agent, agents-service, ...). Read from the binary, so that the manifests are checked
    against where it really looks, not against a copy of its defaults kept here."""
    text = subprocess.run([STRATA, "operator", "run", "--help"], capture_output=True, text=True, check=True).stdout
    blocks, flag = {}, None
    for line in text.splitlines():
        m = re.match(r"^ {2,6}(?:-\w, )?--([a-z0-9-]+)", line)
        if m:
            flag = m[1]
            blocks[flag] = line
        elif flag is not None:
            blocks[flag] += " " + line.strip()
    # clap wraps its help at spaces, so a block's text with its whitespace folded holds the whole default.
    return {f: m[1] for f, b in blocks.items() if (m := re.search(r"\[default: ([^\]]+)\]", " ".join(b.split())))}


def operator_container(objects):
    (c,) = find(objects, "Deployment", "strata-operator")["spec"]["template"]["spec"]["containers"]
    return c


def operator_arg(objects, flag, defaults):
    """What the operator runs with for `--flag`: its args' value, else the binary's default."""
    args = operator_container(objects).get("args") or []
    return args[args.index("--" + flag) + 1] if "--" + flag in args else defaults.get(flag)
