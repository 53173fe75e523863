"""The Kubernetes manifests in deploy/: what `kubectl apply -f deploy/` applies is well formed, the CRDs are
the ones the binary generates, the samples validate against the CRDs' own schemas, and the operator's RBAC is
least privilege (read by this test, rule by rule).

No API server runs here (see ARCHITECTURE.md): these checks are what stands in for `kubectl apply --dry-run=server`.
"""
import copy
import glob
import os
import subprocess

import jsonschema
import pytest
import yaml

from conftest import STRATA

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def applied():
    """Every document `kubectl apply -f deploy/` applies (its top-level .yaml files, in name order)."""
    out = []
    for p in sorted(glob.glob(os.path.join(DEPLOY, "*.yaml"))):
        out += [(os.path.basename(p), d) for d in docs(p)]
    return out


def crd_schemas():
    out = {}
    for _, d in applied():
        if d["kind"] == "CustomResourceDefinition":
            for v in d["spec"]["versions"]:
                out[(d["spec"]["group"] + "/" + v["name"], d["spec"]["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    return out


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


def test_the_operators_rbac_is_least_privilege():
    roles = [d for _, d in applied() if d["kind"] in ("ClusterRole", "Role")]
    assert roles, "the operator's role is in deploy/"
    for r in roles:
        for rule in r["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), (r["metadata"]["name"], rule)
            assert not rule.get("nonResourceURLs"), rule
            assert "secrets" not in rule["resources"], ("no secrets", rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
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


def test_the_operator_runs_unprivileged_and_gets_its_token_without_reading_secrets():
    dep = next(d for _, d in applied() if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["args"][:2] == ["operator", "run"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    env = {e["name"]: e for e in c["env"]}
    assert "secretKeyRef" in env["STRATA_TOKEN"]["valueFrom"], "the kubelet resolves it; no RBAC on secrets"
    # Two replicas, one reconciling: the Lease is named after the pod, in the pod's namespace.
    assert dep["spec"]["replicas"] == 2
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
