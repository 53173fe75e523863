"""The Kubernetes manifests in deploy/, the cluster-wide side and the operator: what `kubectl apply -k deploy/`
applies (the kustomize base, deploy/kustomization.yaml) is well formed and lists every manifest, every document
(and sample) is structurally valid, the CRDs are the ones the binary generates, the samples validate against the
CRDs' own schemas, the RBAC checker rejects what is not least privilege, the operator's RBAC is least privilege
(read by this test, rule by rule) and exactly what it needs, its Deployment runs unprivileged, and its pod admission
webhook (the MutatingWebhookConfiguration strata-pods, its Service, TLS Secret and the docs' Certificate) fits
together. The node side (the agents' RBAC, DaemonSet, ConfigMap and Services) is test_deploy_agents.py; the
helpers both share are deploy_manifests.py.

No API server runs here (see ARCHITECTURE.md): these checks are what stands in for `kubectl apply --dry-run=server`.
Each checker returns the problems it finds, and each test also hands it broken copies to show that it finds them.
"""
import copy
import glob
import os
import re
import subprocess

import jsonschema
import pytest
import yaml

from conftest import STRATA
from deploy_manifests import (DEPLOY, NAMESPACE, ROOT, all_documents, applied, containers, crd_schemas, docs, find,
                              kustomization, manifests, objs, operator_arg, operator_container, operator_run_defaults,
                              pod_spec, rbac_problems, resolves, structure_problems)


def test_every_applied_document_names_its_kind_and_the_crds_come_first():
    seen = applied()
    assert seen, "deploy/ has manifests"
    for name, d in seen:
        assert d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), (name, d)
    kinds = [d["kind"] for _, d in seen]
    assert kinds.index("CustomResourceDefinition") < kinds.index("Deployment"), kinds


def test_the_checked_in_crds_are_what_the_binary_generates():
    out = subprocess.run([STRATA, "operator", "crds"], capture_output=True, text=True, check=True).stdout
    with open(os.path.join(DEPLOY, "00-crds.yaml")) as f:
        assert f.read() == out, "deploy/00-crds.yaml drifted: strata operator crds > deploy/00-crds.yaml"
    names = {d["metadata"]["name"] for d in yaml.safe_load_all(out) if d}
    assert names == {"datasets.strata.dev", "dataclaims.strata.dev"}


def test_the_samples_validate_against_the_crds_schemas_and_a_broken_one_does_not():
    schemas = crd_schemas()
    samples = []
    for p in sorted(glob.glob(os.path.join(DEPLOY, "samples", "*.yaml"))):
        samples += docs(p)
    custom = [s for s in samples if s["apiVersion"].startswith("strata.dev/")]
    assert {s["kind"] for s in custom} == {"Dataset", "DataClaim"}, "a sample of each resource"
    for s in custom:
        schema = schemas[(s["apiVersion"], s["kind"])]
        jsonschema.validate({k: v for k, v in s.items() if k != "metadata"}, schema)
    claim = next(s for s in custom if s["kind"] == "DataClaim")
    schema = schemas[(claim["apiVersion"], "DataClaim")]
    for breakage in [lambda c: c["spec"].__setitem__("datasets", "train"),
                     lambda c: c["spec"]["datasets"][0].pop("name"),
                     lambda c: c["spec"]["scratch"].__setitem__("ttlSeconds", "a day")]:
        bad = copy.deepcopy(claim)
        breakage(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({k: v for k, v in bad.items() if k != "metadata"}, schema)


def test_the_rbac_checker_rejects_what_is_not_least_privilege():
    ok = {"kind": "Role", "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}
    assert rbac_problems(ok) == []
    for rule in [{"apiGroups": ["*"], "resources": ["configmaps"], "verbs": ["get"]},
                 {"apiGroups": [""], "resources": ["*"], "verbs": ["get"]},
                 {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]},
                 {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["*"], "verbs": ["get"]},
                 {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
                 {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]},
                 {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": ["bind"]},
                 {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"]},
                 {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]:
        assert rbac_problems({"kind": "Role", "rules": [rule]}), rule


def test_the_operators_rbac_is_least_privilege():
    roles = [d for _, d in applied() if d["kind"] in ("ClusterRole", "Role")]
    assert roles, "the operator's role is in deploy/"
    for r in roles:
        assert not rbac_problems(r), (r["metadata"]["name"], rbac_problems(r))
        for rule in r["rules"]:
            writes = {"create", "update", "delete", "deletecollection"} & set(rule["verbs"])
            # It creates Events and its Lease, updates only that Lease, and never deletes (a DataClaim's
            # finalizer is a patch).
            assert not writes & {"delete", "deletecollection"}, rule
            if "update" in writes:
                assert rule["resources"] == ["leases"] and rule.get("resourceNames") == ["strata-operator"], rule
            if "create" in writes:
                assert rule["resources"] in (["events"], ["leases"]), rule
            if rule["resources"] == ["leases"]:
                assert r["kind"] == "Role" and r["metadata"]["namespace"] == "strata-system", (r, "its own namespace only")
    # Each service account the manifests run is bound to a role defined here, nothing cluster-wide by default.
    for _, b in applied():
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert b["roleRef"]["name"] in {r["metadata"]["name"] for r in roles}, b
            assert b["roleRef"]["name"] not in ("cluster-admin", "admin", "edit"), b


OPERATOR_SA = {"kind": "ServiceAccount", "name": "strata-operator", "namespace": NAMESPACE}
# Everything the operator may do, as (namespace or None for cluster-wide, apiGroup, resource, verb, resourceName
# or None for any): read DataClaims (and patch their finalizers), patch their status, read Datasets and Namespaces
# (the team label), list and watch pods (those naming a claim: mounted for on the node they are bound to), write
# Events; in its own namespace, its Lease and the agents' EndpointSlices (a Ready DataClaim's status.nodes and
# the agent of each node). The webhook needs nothing more: the API server sends it the pod, and it reads the
# DataClaim with the same get.
OPERATOR_GRANTS = (
    {(None, "strata.dev", "dataclaims", v, None) for v in ("get", "list", "watch", "patch")}
    | {(None, "strata.dev", "dataclaims/status", v, None) for v in ("get", "patch")}
    | {(None, "strata.dev", "datasets", v, None) for v in ("get", "list", "watch", "patch")}
    | {(None, "strata.dev", "datasets/status", v, None) for v in ("get", "patch")}
    | {(None, "", "namespaces", "get", None)}
    | {(None, "", "pods", v, None) for v in ("list", "watch")}
    | {(None, "events.k8s.io", "events", v, None) for v in ("create", "patch")}
    | {(NAMESPACE, "coordination.k8s.io", "leases", "create", None)}
    | {(NAMESPACE, "coordination.k8s.io", "leases", v, "strata-operator") for v in ("get", "update")}
    | {(NAMESPACE, "discovery.k8s.io", "endpointslices", v, None) for v in ("get", "list", "watch")})


def grants(role, scope):
    """What `role` allows, bound at `scope` (a namespace, or None: cluster-wide), one tuple per permission."""
    return {(scope, g, r, v, n) for rule in role.get("rules") or [] for g in rule.get("apiGroups", [])
            for r in rule.get("resources", []) for v in rule.get("verbs", []) for n in rule.get("resourceNames") or [None]}


def operator_rbac_problems(objects):
    """The operator's service account is granted exactly OPERATOR_GRANTS, through roles of the base that are
    least privilege, and the Deployment runs as it."""
    out = []
    granted = set()
    for b in objects:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any({k: s.get(k) for k in OPERATOR_SA} == OPERATOR_SA for s in b.get("subjects") or []):
            continue
        ref = b.get("roleRef") or {}
        # A RoleBinding scopes what it binds (a Role of its namespace, or a ClusterRole) to its namespace.
        scope = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        if b["kind"] == "ClusterRoleBinding" and ref.get("kind") != "ClusterRole":
            out.append(f"{b['metadata']['name']}: a ClusterRoleBinding of a {ref.get('kind')}")
            continue
        role = next((r for r in objects if r["kind"] == ref.get("kind") and r["metadata"]["name"] == ref.get("name")
                     and (r["kind"] == "ClusterRole" or r["metadata"].get("namespace") == scope)), None)
        if role is None:
            out.append(f"{b['kind']} {b['metadata']['name']} binds {ref}, which the base does not define there")
            continue
        out += [f"{role['metadata']['name']}: {p}" for p in rbac_problems(role)]
        granted |= grants(role, scope)
    if granted != OPERATOR_GRANTS:
        out.append(f"the operator is granted {sorted(granted - OPERATOR_GRANTS, key=str)} more and "
                   f"{sorted(OPERATOR_GRANTS - granted, key=str)} less than it needs")
    dep = find(objects, "Deployment", "strata-operator")
    if dep["spec"]["template"]["spec"].get("serviceAccountName") != OPERATOR_SA["name"]:
        out.append("the operator's Deployment does not run as strata-operator")
    return out


def test_the_operators_grants_are_exactly_what_it_needs_endpointslices_in_its_own_namespace_only():
    objects = objs()
    assert operator_rbac_problems(objects) == []

    def role(o, name):
        return next(d for d in o if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"] == name)

    def slices_rule(o):
        return next(r for r in role(o, "strata-operator-agents")["rules"] if "endpointslices" in r["resources"])

    def move_slices_cluster_wide(o):
        rule = slices_rule(o)
        role(o, "strata-operator-agents")["rules"].remove(rule)
        role(o, "strata-operator")["rules"].append(rule)

    crb = {"kind": "ClusterRoleBinding", "metadata": {"name": "x"}, "roleRef": {"kind": "ClusterRole", "name": "view"},
           "subjects": [dict(OPERATOR_SA)]}
    for breakage in [move_slices_cluster_wide,
                     lambda o: slices_rule(o)["verbs"].append("create"),
                     lambda o: slices_rule(o)["verbs"].remove("watch"),
                     lambda o: slices_rule(o).__setitem__("resources", ["*"]),
                     lambda o: slices_rule(o).__setitem__("apiGroups", [""]),  # v1 endpoints, not the slices
                     lambda o: role(o, "strata-operator-agents")["metadata"].__setitem__("namespace", "default"),
                     lambda o: o.remove(role(o, "strata-operator-agents")),
                     lambda o: role(o, "strata-operator")["rules"].append(
                         {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
                     lambda o: role(o, "strata-operator")["rules"].append(
                         {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}),
                     lambda o: role(o, "strata-operator")["rules"].append(
                         {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}),
                     lambda o: o.append(crb),
                     lambda o: find(o, "Deployment", "strata-operator")["spec"]["template"]["spec"].pop("serviceAccountName")]:
        bad = copy.deepcopy(objects)
        breakage(bad)
        assert operator_rbac_problems(bad), breakage


def test_the_operator_runs_unprivileged_and_gets_its_token_without_reading_secrets():
    dep = next(d for _, d in applied() if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["args"][:2] == ["operator", "run"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"] and "add" not in c["securityContext"]["capabilities"]
    assert not c["securityContext"].get("privileged")
    env = {e["name"]: e for e in c["env"]}
    assert "secretKeyRef" in env["STRATA_TOKEN"]["valueFrom"], "the kubelet resolves it; no RBAC on secrets"
    # Two replicas, one reconciling: the Lease is named after the pod, in the pod's namespace.
    assert dep["spec"]["replicas"] == 2
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


# --- The kustomize base --------------------------------------------------------------------------------------


def images(objects):
    """Every container image the documents run."""
    return {c["image"] for d in objects if pod_spec(d) for c in containers(pod_spec(d))}


def base_problems(k, files, used_images):
    """What is wrong with kustomization `k` as the base of deploy/, whose manifests are `files` and whose
    workloads run `used_images`: `kubectl apply -k deploy/` must apply every manifest, nothing else (not the
    samples), unchanged but for the image tag a site pins."""
    out = []
    if k.get("apiVersion") != "kustomize.config.k8s.io/v1beta1" or k.get("kind") != "Kustomization":
        out.append("not a kustomize.config.k8s.io/v1beta1 Kustomization")
    res = k.get("resources") or []
    if len(set(res)) != len(res):
        out.append(f"resources listed twice: {res}")
    out += [f"{r}: listed, but not a manifest of deploy/" for r in res if r not in files]
    out += [f"{f}: in deploy/, but not in the base" for f in files if f not in res]
    if "namespace" in k:
        out.append("a namespace override (every resource names its namespace, and addresses inside them do too)")
    for key in ("patches", "patchesStrategicMerge", "patchesJson6902", "namePrefix", "nameSuffix",
                "configMapGenerator", "secretGenerator", "commonLabels", "labels"):
        if key in k:
            out.append(f"{key}: the base would apply something other than the files")
    pins = {i.get("name"): i for i in k.get("images") or []}
    for image in sorted(used_images):
        name, _, tag = image.rpartition(":")
        if name not in pins:
            out.append(f"{image}: no images entry to pin it with")
        elif pins[name].get("newTag") != tag or "newName" in pins[name] or "digest" in pins[name]:
            out.append(f"{image}: the base's images entry {pins[name]} changes it")
    used_names = {i.rpartition(":")[0] for i in used_images}
    out += [f"images entry {n} matches no container" for n in pins if n not in used_names]
    return out


def test_the_kustomize_base_lists_every_manifest_and_nothing_else():
    k, files, used = kustomization(), manifests(), images(objs())
    assert "20-agents.yaml" in files and used, (files, used)
    for r in k["resources"]:
        assert os.path.isfile(os.path.join(DEPLOY, r)), r
    assert base_problems(k, files, used) == []
    for breakage in [lambda k: k["resources"].remove("20-agents.yaml"),
                     lambda k: k["resources"].append("samples/dataclaim.yaml"),
                     lambda k: k["resources"].append("30-missing.yaml"),
                     lambda k: k["resources"].append("10-operator.yaml"),
                     lambda k: k.__setitem__("namespace", "strata"),
                     lambda k: k.__setitem__("namePrefix", "site-"),
                     lambda k: k.__setitem__("images", []),
                     lambda k: k["images"][0].__setitem__("newTag", "0.0.9"),
                     lambda k: k["images"][0].__setitem__("name", "ghcr.io/elsewhere/strata"),
                     lambda k: k.__setitem__("kind", "Component")]:
        bad = copy.deepcopy(k)
        breakage(bad)
        assert base_problems(bad, files, used), bad
    # A manifest added to deploy/ without listing it is drift too.
    assert base_problems(k, files + ["30-new.yaml"], used)


# --- Structure: what the API server's validation would refuse (the checker is deploy_manifests.py's) -------


def test_every_manifest_is_structurally_valid_and_a_broken_one_is_not():
    seen = all_documents()
    assert {f for f, _ in seen} >= {"00-crds.yaml", "10-operator.yaml", "20-agents.yaml", "samples/dataclaim.yaml"}
    for f, d in seen:
        assert structure_problems(d) == [], (f, structure_problems(d))
    ds = find(objs(), "DaemonSet", "strata-agent")
    svc = find(objs(), "Service", "strata-api")

    def agent(d):
        return d["spec"]["template"]["spec"]["containers"][0]

    for target, breakage in [
            (ds, lambda d: d["spec"]["template"]["spec"]["containers"].append(copy.deepcopy(agent(d)))),
            (ds, lambda d: agent(d)["volumeMounts"].append({"name": "nowhere", "mountPath": "/x"})),
            (ds, lambda d: agent(d)["volumeMounts"].append(dict(agent(d)["volumeMounts"][0], name="state"))),
            (ds, lambda d: agent(d)["ports"][0].__setitem__("name", "control-api-port")),  # 16 characters
            (ds, lambda d: agent(d)["ports"][1].__setitem__("name", "api")),
            (ds, lambda d: agent(d)["ports"][0].__setitem__("name", "API")),
            (ds, lambda d: agent(d)["readinessProbe"]["httpGet"].__setitem__("port", "http")),
            (ds, lambda d: d["spec"]["template"]["spec"]["volumes"][0].__setitem__("emptyDir", {})),
            (ds, lambda d: d["spec"]["selector"]["matchLabels"].__setitem__("app.kubernetes.io/name", "other")),
            (ds, lambda d: agent(d).pop("image")),
            (ds, lambda d: d["metadata"].pop("namespace")),
            (ds, lambda d: d["metadata"].__setitem__("name", "Strata_Agent")),
            (ds, lambda d: d.pop("kind")),
            (svc, lambda d: d["spec"]["ports"][1].pop("name")),
            (svc, lambda d: d["spec"]["ports"][1].__setitem__("port", "9000"))]:
        bad = copy.deepcopy(target)
        breakage(bad)
        assert structure_problems(bad), bad
    crd = next(d for _, d in seen if d["kind"] == "CustomResourceDefinition")
    assert structure_problems(dict(crd, metadata=dict(crd["metadata"], namespace=NAMESPACE)))


# --- Pods declare their data: the operator's admission webhook ------------------------------------------------

CLAIM_LABEL = "strata.dev/claim"
WEBHOOK_TLS_SECRET = "strata-operator-webhook-tls"
DOCS = os.path.join(ROOT, "docs", "kubernetes.md")


def selector_matches(sel, labels):
    """Whether a LabelSelector (matchLabels, matchExpressions) matches `labels`, as the API server decides;
    an empty or missing one matches everything."""
    sel = sel or {}
    if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    for e in sel.get("matchExpressions") or []:
        k, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        ok = {"In": lambda: labels.get(k) in values and k in labels,
              "NotIn": lambda: k not in labels or labels[k] not in values,
              "Exists": lambda: k in labels,
              "DoesNotExist": lambda: k not in labels}.get(op, lambda: False)()
        if not ok:
            return False
    return True


def webhook_problems(objects, defaults):
    """The MutatingWebhookConfiguration strata-pods: the CREATE of pods labelled strata.dev/claim, and only those,
    goes to the operator's Service, whose port reaches the container port the operator serves the webhook on,
    failing closed; the webhook's certificate and key are the Secret's, mounted where the binary looks for them,
    readable by the operator's user; the API server trusts the certificate's CA (cert-manager's injector, or a
    caBundle)."""
    out = []
    confs = [d for d in objects if d["kind"] == "MutatingWebhookConfiguration"]
    if [c["metadata"]["name"] for c in confs] != ["strata-pods"]:
        return [f"not one MutatingWebhookConfiguration strata-pods: {[c['metadata']['name'] for c in confs]}"]
    (conf,) = confs
    hooks = conf.get("webhooks") or []
    if len(hooks) != 1:
        return [f"strata-pods has {len(hooks)} webhooks, not one"]
    (hook,) = hooks
    if hook.get("name") != "pods.strata.dev":
        out.append(f"webhook name {hook.get('name')!r}")
    if hook.get("admissionReviewVersions") != ["v1"]:
        out.append(f"admissionReviewVersions {hook.get('admissionReviewVersions')}: the webhook speaks admission.k8s.io/v1")
    if hook.get("sideEffects") != "None":
        out.append(f"sideEffects {hook.get('sideEffects')!r}: it has none (it reads a DataClaim), and dry runs need None")
    if hook.get("failurePolicy") != "Fail":
        out.append(f"failurePolicy {hook.get('failurePolicy')!r}: a pod that declares its data would start without it "
                   "(no environment, any node, data not staged) whenever the webhook is away")
    if not 1 <= hook.get("timeoutSeconds", 10) <= 30:
        out.append(f"timeoutSeconds {hook.get('timeoutSeconds')} is outside the API's 1..30")
    if hook.get("reinvocationPolicy") != "IfNeeded":
        out.append("reinvocationPolicy is not IfNeeded: a container a later webhook adds would miss the environment")
    # Which pods: those naming a claim, and only those, in every namespace.
    sel = hook.get("objectSelector")
    if not selector_matches(sel, {CLAIM_LABEL: "resnet", "job-name": "train"}):
        out.append(f"the objectSelector {sel} does not send a pod labelled {CLAIM_LABEL} to the webhook")
    if selector_matches(sel, {}) or selector_matches(sel, {"app": "web", "strata.dev/team": "vision"}):
        out.append(f"the objectSelector {sel} sends pods without {CLAIM_LABEL} too: every pod of the cluster would "
                   "fail closed with the operator")
    ns_sel = hook.get("namespaceSelector")
    if not (selector_matches(ns_sel, {}) and selector_matches(ns_sel, {"strata.dev/team": "vision"})):
        out.append(f"the namespaceSelector {ns_sel} skips namespaces, whose labelled pods would start unmutated")
    rules = hook.get("rules") or []
    if not rules:
        out.append("no rules")
    for r in rules:
        if (r.get("operations"), r.get("apiGroups"), r.get("apiVersions"), r.get("resources")) != (["CREATE"], [""], ["v1"], ["pods"]):
            out.append(f"rule {r}: not the CREATE of v1 pods alone (a pod's environment and affinity are set at creation)")
        if r.get("scope", "*") not in ("Namespaced", "*"):
            out.append(f"rule {r}: scope {r.get('scope')!r}")
    # Where: the operator's Service, to the container port the operator listens on.
    cc = hook.get("clientConfig") or {}
    ref = cc.get("service") or {}
    if "url" in cc or not ref:
        out.append(f"clientConfig {cc}: not the operator's Service")
    if ref.get("path") != "/mutate-pods":
        out.append(f"clientConfig path {ref.get('path')!r}: the operator serves POST /mutate-pods")
    dep = find(objects, "Deployment", "strata-operator")
    template = dep["spec"]["template"]
    c = operator_container(objects)
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    svc = next((d for d in objects if d["kind"] == "Service" and d["metadata"]["name"] == ref.get("name")
                and d["metadata"].get("namespace") == ref.get("namespace")), None)
    if svc is None:
        out.append(f"clientConfig.service {ref.get('namespace')}/{ref.get('name')} is no Service of the base")
    else:
        labels = template["metadata"].get("labels") or {}
        svc_sel = svc["spec"].get("selector") or {}
        if not svc_sel or any(labels.get(k) != v for k, v in svc_sel.items()):
            out.append(f"{svc['metadata']['name']} selects {svc_sel}, not the operator's pods {labels}")
        if svc["spec"].get("clusterIP") == "None" or svc["spec"].get("type", "ClusterIP") != "ClusterIP":
            out.append(f"{svc['metadata']['name']} is not a ClusterIP Service")
        port = next((p for p in svc["spec"].get("ports", []) if p.get("port") == ref.get("port", 443)), None)
        if port is None or not resolves(port.get("targetPort", port["port"]), ports, "webhook"):
            out.append(f"{svc['metadata']['name']} has no port {ref.get('port', 443)} reaching the operator's port "
                       f"named webhook ({ports})")
    args = c.get("args") or []
    if "--webhook-listen" not in args:
        out.append("the operator does not serve the webhook (no --webhook-listen)")
    else:
        host, _, port = args[args.index("--webhook-listen") + 1].rpartition(":")
        if not port.isdigit() or int(port) != ports.get("webhook"):
            out.append(f"--webhook-listen {host}:{port} is not the container port named webhook ({ports.get('webhook')})")
        if host in ("127.0.0.1", "localhost", "[::1]"):
            out.append("--webhook-listen is loopback only: the API server cannot reach it")
    # TLS: the Secret's tls.crt and tls.key (a kubernetes.io/tls Secret, as cert-manager writes it), where
    # --webhook-cert and --webhook-key look.
    pod = template["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = [m for m in c.get("volumeMounts", [])
              if ((volumes.get(m["name"]) or {}).get("secret") or {}).get("secretName") == WEBHOOK_TLS_SECRET]
    if len(mounts) != 1:
        out.append(f"the Secret {WEBHOOK_TLS_SECRET} is mounted {len(mounts)} times into the operator, not once")
    else:
        (m,) = mounts
        secret = volumes[m["name"]]["secret"]
        if not m.get("readOnly"):
            out.append("the webhook's Secret is mounted read-write")
        items = {i["path"]: i["key"] for i in secret.get("items") or []}
        for flag, key in (("webhook-cert", "tls.crt"), ("webhook-key", "tls.key")):
            path = operator_arg(objects, flag, defaults)
            if not path:
                out.append(f"--{flag}: not given and no default")
                continue
            d, name = os.path.split(os.path.normpath(path))
            got = (items.get(name) if items else name) if d == os.path.normpath(m["mountPath"]) else None
            if got != key:
                out.append(f"--{flag} is {path}: not the Secret's {key} (mounted at {m['mountPath']}, items {items})")
        mode = secret.get("defaultMode", 0o644)
        sc = pod.get("securityContext") or {}
        if not (mode & 0o004 or (mode & 0o040 and sc.get("fsGroup") is not None)
                or (mode & 0o400 and sc.get("runAsUser") == 0)):
            out.append(f"the webhook's key (mode {mode:o}, fsGroup {sc.get('fsGroup')}) is not readable by the "
                       f"operator's user {sc.get('runAsUser')}")
    # Trust: cert-manager's injector fills caBundle from the Certificate named here, or the site sets it.
    inject = (conf["metadata"].get("annotations") or {}).get("cert-manager.io/inject-ca-from")
    if inject is None and not cc.get("caBundle"):
        out.append("no caBundle and no cert-manager.io/inject-ca-from: the API server cannot verify the webhook")
    elif inject is not None:
        ns, _, name = inject.partition("/")
        if ns != ref.get("namespace") or not name:
            out.append(f"cert-manager.io/inject-ca-from {inject!r} is not a Certificate in {ref.get('namespace')}")
    return out


def test_pods_that_name_a_claim_and_only_they_go_through_the_operators_webhook_which_fails_closed():
    objects, defaults = objs(), operator_run_defaults()
    assert {"webhook-cert", "webhook-key", "node-agent", "agents-service"} <= defaults.keys(), (
        "strata operator run --help shows no default for the webhook's flags (a stale binary?)", defaults)
    assert webhook_problems(objects, defaults) == []

    def hook(o):
        return find(o, "MutatingWebhookConfiguration", "strata-pods")["webhooks"][0]

    def svc(o):
        return find(o, "Service", "strata-operator-webhook")

    def pod(o):
        return find(o, "Deployment", "strata-operator")["spec"]["template"]["spec"]

    def args(o):
        return operator_container(o)["args"]

    def set_arg(flag, value):
        def f(o):
            a = args(o)
            if flag in a:
                a[a.index(flag) + 1] = value
            else:
                a += [flag, value]
        return f

    def tls(o):
        return next(v for v in pod(o)["volumes"] if (v.get("secret") or {}).get("secretName") == WEBHOOK_TLS_SECRET)

    def tls_mount(o):
        return next(m for m in operator_container(o)["volumeMounts"] if m["name"] == tls(o)["name"])

    def port(o, name):
        return next(p for p in operator_container(o)["ports"] if p["name"] == name)

    # What a site may do differently and still be right: map the Secret's keys explicitly, or set caBundle
    # itself instead of cert-manager's annotation.
    for variant in [lambda o: tls(o)["secret"].__setitem__("items", [{"key": "tls.key", "path": "tls.key"},
                                                                      {"key": "tls.crt", "path": "tls.crt"}]),
                    lambda o: find(o, "MutatingWebhookConfiguration", "strata-pods")["metadata"].pop("annotations")
                    and hook(o)["clientConfig"].__setitem__("caBundle", "LS0tLS1CRUdJTi..."),
                    lambda o: hook(o).__setitem__("namespaceSelector", {})]:
        ok = copy.deepcopy(objects)
        variant(ok)
        assert webhook_problems(ok, defaults) == [], (variant, webhook_problems(ok, defaults))

    for i, breakage in enumerate([
            lambda o: hook(o).__setitem__("failurePolicy", "Ignore"),
            lambda o: hook(o).pop("objectSelector"),
            lambda o: hook(o)["objectSelector"]["matchExpressions"][0].__setitem__("operator", "DoesNotExist"),
            lambda o: hook(o)["objectSelector"]["matchExpressions"][0].__setitem__("key", "strata.dev/dataclaim"),
            lambda o: hook(o).__setitem__("namespaceSelector", {"matchLabels": {"strata.dev/team": "vision"}}),
            lambda o: hook(o)["rules"][0]["operations"].append("UPDATE"),
            lambda o: hook(o)["rules"][0].__setitem__("resources", ["*"]),
            lambda o: hook(o)["rules"][0].__setitem__("apiGroups", ["*"]),
            lambda o: hook(o).__setitem__("sideEffects", "Unknown"),
            lambda o: hook(o).__setitem__("admissionReviewVersions", ["v1beta1"]),
            lambda o: hook(o).__setitem__("timeoutSeconds", 60),
            lambda o: hook(o).__setitem__("reinvocationPolicy", "Never"),
            lambda o: hook(o)["clientConfig"]["service"].__setitem__("path", "/mutate"),
            lambda o: hook(o)["clientConfig"]["service"].__setitem__("port", 8443),
            lambda o: hook(o)["clientConfig"]["service"].__setitem__("name", "strata-operator"),
            lambda o: hook(o)["clientConfig"]["service"].__setitem__("namespace", "default"),
            lambda o: hook(o)["clientConfig"].__setitem__("url", "https://strata.example/mutate-pods"),
            lambda o: find(o, "MutatingWebhookConfiguration", "strata-pods")["webhooks"].append(copy.deepcopy(hook(o))),
            lambda o: svc(o)["spec"]["ports"][0].__setitem__("targetPort", "metrics"),
            lambda o: svc(o)["spec"]["selector"].__setitem__("app.kubernetes.io/name", "strata-agent"),
            lambda o: svc(o)["spec"].__setitem__("clusterIP", "None"),
            lambda o: port(o, "webhook").__setitem__("name", "https"),
            lambda o: [args(o).remove(a) for a in ["--webhook-listen", "0.0.0.0:8443"]],
            set_arg("--webhook-listen", "127.0.0.1:8443"),
            set_arg("--webhook-listen", "0.0.0.0:9443"),
            set_arg("--webhook-cert", "/etc/strata/webhook/ca.crt"),
            set_arg("--webhook-key", "/etc/strata/tls.key"),
            lambda o: tls_mount(o).__setitem__("mountPath", "/etc/strata/tls"),
            lambda o: tls_mount(o).pop("readOnly"),
            lambda o: tls(o)["secret"].__setitem__("secretName", "strata-operator-tls"),
            lambda o: tls(o)["secret"].__setitem__("items", [{"key": "tls.crt", "path": "cert.pem"},
                                                              {"key": "tls.key", "path": "key.pem"}]),
            lambda o: tls(o)["secret"].__setitem__("defaultMode", 0o400),
            lambda o: pod(o)["securityContext"].pop("fsGroup"),
            lambda o: find(o, "MutatingWebhookConfiguration", "strata-pods")["metadata"].pop("annotations"),
            lambda o: find(o, "MutatingWebhookConfiguration", "strata-pods")["metadata"]["annotations"].__setitem__(
                "cert-manager.io/inject-ca-from", "cert-manager/strata-operator-webhook")]):
        bad = copy.deepcopy(objects)
        breakage(bad)
        assert webhook_problems(bad, defaults), (i, breakage)


def docs_certificates():
    """The cert-manager Certificates docs/kubernetes.md tells a site to create (in its ```yaml blocks)."""
    with open(DOCS) as f:
        text = f.read()
    return [d for block in re.findall(r"```yaml\n(.*?)```", text, re.S) for d in yaml.safe_load_all(block)
            if isinstance(d, dict) and d.get("kind") == "Certificate"]


def certificate_problems(certs, objects):
    """Of the Certificates the docs show, the one strata-pods has cert-manager inject the CA of issues the Secret
    the operator mounts, for the name the API server calls (the webhook Service's DNS name), and is a serving
    certificate, not a CA."""
    conf = find(objects, "MutatingWebhookConfiguration", "strata-pods")
    ref = conf["webhooks"][0]["clientConfig"]["service"]
    inject = (conf["metadata"].get("annotations") or {}).get("cert-manager.io/inject-ca-from")
    named = [c for c in certs if f"{(c.get('metadata') or {}).get('namespace')}/{(c.get('metadata') or {}).get('name')}" == inject]
    if len(named) != 1:
        return [f"docs/kubernetes.md shows {len(named)} Certificates {inject} (the one strata-pods injects the CA of)"]
    (cert,) = named
    out = []
    spec = cert.get("spec") or {}
    if cert.get("apiVersion") != "cert-manager.io/v1":
        out.append(f"apiVersion {cert.get('apiVersion')}")
    if spec.get("secretName") != WEBHOOK_TLS_SECRET:
        out.append(f"secretName {spec.get('secretName')}: the operator mounts {WEBHOOK_TLS_SECRET}")
    if f"{ref['name']}.{ref['namespace']}.svc" not in (spec.get("dnsNames") or []):
        out.append(f"dnsNames {spec.get('dnsNames')} lack {ref['name']}.{ref['namespace']}.svc, the name the API server calls")
    if spec.get("isCA"):
        out.append("the webhook's serving certificate is a CA")
    if not (spec.get("issuerRef") or {}).get("name"):
        out.append("no issuerRef")
    return out


def test_the_docs_certificate_issues_the_secret_the_operator_mounts_for_the_webhooks_service_name():
    objects, certs = objs(), docs_certificates()
    assert certificate_problems(certs, objects) == []

    def serving(c):
        return next(x for x in c if x["spec"].get("secretName") == WEBHOOK_TLS_SECRET)

    for breakage in [lambda c: serving(c)["spec"].__setitem__("secretName", "webhook-tls"),
                     lambda c: serving(c)["spec"].__setitem__("dnsNames", ["strata-operator-webhook"]),
                     lambda c: serving(c)["metadata"].__setitem__("name", "webhook"),
                     lambda c: serving(c)["metadata"].__setitem__("namespace", "cert-manager"),
                     lambda c: serving(c)["spec"].__setitem__("isCA", True),
                     lambda c: serving(c)["spec"].pop("issuerRef"),
                     lambda c: c.append(copy.deepcopy(serving(c))),
                     lambda c: c.remove(serving(c))]:
        bad = copy.deepcopy(certs)
        breakage(bad)
        assert certificate_problems(bad, objects), breakage
