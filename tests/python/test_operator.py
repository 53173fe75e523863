"""The Kubernetes operator end to end: `strata operator run` against a fake Kubernetes API server, reconciling
DataClaims into claims on a real `strata serve` (an S3 origin on moto).

The API server is a mock (kmock 0.8 with the add-ons in kube_api.py: resourceVersions, a status subresource,
watches from a resourceVersion), not a real cluster: no admission, no schema validation, no RBAC, no other
controllers. What this proves is the operator's side of the contract, through its real kube-rs client and
Controller, over HTTP: the finalizer goes on; the team comes from the namespace's `strata.dev/team` label; a
DataClaim becomes a claim on the agent and its status follows the claim to Ready (and is not written again
when nothing changed); refusals (no team label, data missing on the origin) are Failed with the reason and a
Warning event, and make no claim; deleting a DataClaim releases its claim and the object goes; an agent that
cannot be reached does not keep a deleted DataClaim forever (ForcedRelease after --force-release-after-secs);
of two operators only the Lease's holder reconciles, and the other takes over when it dies.

The pod admission webhook (`--webhook-listen`) is called here as the API server calls it: AdmissionReview v1
over HTTPS (the test's self-signed certificate standing in for cert-manager's), its JSON patch applied to the
pod as the API server applies it. The fake API server does not call webhooks itself; what is proven is the
webhook's side: a pod labelled `strata.dev/claim` is admitted once its DataClaim is Ready, with the node-local
agent, the claim's environment and affinity toward the nodes of the agents' ready endpoints (which the operator
reads from the EndpointSlices of `strata-agents` into `status.nodes`), and denied, with the reason, before.
"""
import base64
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import jsonpatch
import pytest
import yaml

from conftest import ADMIN_TOKEN, ROOT, STRATA, free_port, wait_port
from test_claims import BUCKET, MIB, Agent, put_dataset, s3  # noqa: F401  (s3 is a fixture)
from kube_api import (FakeKubeApi, dataclaims, datasets, endpointslices, events, leases, namespaces,
                      resource_path)
from deploy_manifests import structure_problems

FINALIZER = "strata.dev/release"
FORCE_RELEASE_AFTER_SECS = 3
LEASE_SECS = 3
TIMEOUT = 30


class Operator:
    """One `strata operator run` against the fake API server and one agent; its log in a file."""

    def __init__(self, agent_api, kubeconfig, log_path, holder="op-a", webhook=None, agents_service=None,
                 extra_args=()):
        """`webhook`: (port, certfile, keyfile) to serve the admission webhook on 127.0.0.1:port with that
        certificate; `agents_service`: --agents-service (else the binary's default, strata-agents);
        `extra_args`: more flags of `strata operator run`."""
        self.metrics_port = free_port()
        self.metrics = f"http://127.0.0.1:{self.metrics_port}"
        self.log_path = log_path
        self._log = open(log_path, "ab")
        env = dict(os.environ, STRATA_TOKEN=ADMIN_TOKEN, KUBECONFIG=kubeconfig, RUST_LOG="info",
                   # the CLI's log filter is STRATA_LOG; kube-runtime's watcher says why a list/watch failed at debug
                   STRATA_LOG="info,strata_k8s=debug,kube_runtime=debug,kube_client=info")
        # POD_NAMESPACE would move the Lease and the agents' EndpointSlices out of the default strata-system,
        # where the tests look for them.
        for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "STRATA_AGENT", "POD_NAMESPACE"):
            env.pop(k, None)
        args = [STRATA, "operator", "run", "--agent", agent_api, "--metrics-addr", f"127.0.0.1:{self.metrics_port}",
                "--staging-poll-ms", "200", "--force-release-after-secs", str(FORCE_RELEASE_AFTER_SECS),
                "--refused-retry-secs", "2", "--lease-holder", holder, "--lease-secs", str(LEASE_SECS)]
        if webhook is not None:
            port, certfile, keyfile = webhook
            args += ["--webhook-listen", f"127.0.0.1:{port}", "--webhook-cert", certfile, "--webhook-key", keyfile,
                     "--webhook-reload-secs", "1"]
        if agents_service is not None:
            args += ["--agents-service", agents_service]
        args += list(extra_args)
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL, env=env)
        # A start that fails is recorded, not raised: each test asserts it first (`Cluster.ready`), so a broken
        # operator is a failed test with the reason, not a fixture error.
        self.start_error = None
        try:
            wait_port(self.metrics_port, self.proc)
            if webhook is not None:
                # Bound right after /metrics, before the Lease: every replica serves it, leader or not.
                wait_port(webhook[0], self.proc)
        except RuntimeError as e:
            self.start_error = f"strata operator run did not start ({e})"

    def alive(self):
        log = None if self.proc.poll() is None else self.log()
        if log is not None and "CryptoProvider" in log:
            # Seen once (fixed): rustls is built with both its `aws_lc_rs` (strata-object) and `ring` (kube's
            # `ring` feature) providers, so it cannot pick a process default, and kube-client's TLS setup panics
            # in `Client::try_default` even for an http:// server unless the binary names one.
            raise AssertionError(
                "strata operator run panicked creating the Kubernetes client: rustls found no process-level "
                "CryptoProvider (both aws-lc-rs and ring are enabled; the binary must call "
                "CryptoProvider::install_default() before kube::Client::try_default). Log:\n" + _tail(log, 40))
        assert log is None, f"strata operator exited with {self.proc.returncode}:\n{_tail(log, 80)}"
        assert self.start_error is None, f"{self.start_error}:\n{_tail(self.log(), 80)}"

    def metric(self, name):
        """The value of one sample line (`name{labels}`) of /metrics, 0 if absent."""
        text = urllib.request.urlopen(self.metrics + "/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class Cluster:
    def __init__(self, kube, agent, operator):
        self.kube, self.api, self.agent, self.operator = kube, kube.client, agent, operator

    def ready(self):
        """Assert the operator started and still runs."""
        self.operator.alive()

    def namespace(self, name, team=None):
        labels = {"strata.dev/team": team} if team else {}
        return self.api.create(namespaces(), {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": name, "labels": labels}})

    def dataclaim(self, ns, name, location):
        return self.api.create(dataclaims(ns), {
            "apiVersion": "strata.dev/v1alpha1", "kind": "DataClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"datasets": [{"name": "train", "location": location}]},
        })

    def get(self, ns, name):
        return self.api.get(dataclaims(ns, name))

    def events(self, ns, name=None):
        return [e for e in self.api.list(events(ns))
                if name is None or (e.get("regarding") or {}).get("name") == name]

    def wait(self, what, probe, check, timeout=TIMEOUT):
        """Poll `probe()` until `check(value)`; the last value is in the failure message."""
        deadline = time.time() + timeout
        while True:
            self.operator.alive()
            value = probe()
            if check(value):
                return value
            assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}; last seen: {value!r}"
            time.sleep(0.2)

    def wait_phase(self, ns, name, phase):
        return self.wait(f"DataClaim {ns}/{name} phase {phase}", lambda: self.get(ns, name),
                         lambda dc: dc is not None and (dc.get("status") or {}).get("phase") == phase)

    def wait_gone(self, ns, name):
        self.wait(f"DataClaim {ns}/{name} to disappear", lambda: self.get(ns, name), lambda dc: dc is None)

    def unchanged_passes(self, kind, ns, name):
        """Reconciles of one object that found its status as computed and wrote nothing (the operator's log)."""
        return sum(1 for line in self.operator.log().splitlines()
                   if "status unchanged, nothing written" in line and f"object={ns}/{name} " in line
                   and f'kind="{kind}"' in line)

    def assert_not_written_again(self, kind, path):
        """Touch the object at `path` (an annotation: a change the operator reconciles, with nothing to write),
        wait until the operator has reconciled it since and found its status as computed, and assert that it
        wrote nothing: a check of an event that happened, not of a quiet interval."""
        ns, name = path.split("/namespaces/")[1].split("/")[0], path.rstrip("/").split("/")[-1]
        before = self.unchanged_passes(kind, ns, name)
        touched = self.api.merge_patch(path, {"metadata": {"annotations": {"strata.test/touched": str(time.time())}}})
        rv = touched["metadata"]["resourceVersion"]
        self.wait(f"the operator to reconcile {kind} {ns}/{name} after a touch", lambda: self.unchanged_passes(
            kind, ns, name), lambda n: n > before)
        after = self.api.get(path)
        assert after["metadata"]["resourceVersion"] == rv, (
            f"the operator wrote an unchanged {kind} again", rv, after["metadata"], after.get("status"))
        assert self.operator.metric(f'strata_operator_status_writes_total{{kind="{kind}",result="unchanged"}}') > 0

    def agent_claims(self, job_prefix):
        """Every claim on the agent (live and released) whose job starts with `job_prefix`."""
        out = {}
        for q in ("", "?released=true"):
            out.update((c["id"], c) for c in self.agent.ok("GET", "/v1/claims" + q) if c["job"].startswith(job_prefix))
        return list(out.values())


def _tail(text, lines):
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def _running_cluster(origin, tmp_path, before_operator=None, **operator_kw):
    """A fresh fake API server, one agent (team `vision`) and an operator between them; all stopped after.
    `before_operator(kube_client, agent)` puts what a cluster already has in the API before the operator's first
    look;
    `operator_kw` go to `Operator`."""
    agent = Agent(origin)
    kube = op = None
    try:
        s, v = agent.call("POST", "/v1/teams", {"name": "vision"}, token=ADMIN_TOKEN)
        assert s in (200, 201, 409), (s, v)
        kube = FakeKubeApi(log_path=str(tmp_path / "kube-api.log"))
        if before_operator is not None:
            before_operator(kube.client, agent)
        op = Operator(agent.api, kube.kubeconfig(str(tmp_path / "kubeconfig")), str(tmp_path / "operator.log"),
                      **operator_kw)
        yield Cluster(kube, agent, op)
    finally:
        if op is not None:
            op.stop()
        if kube is not None:
            kube.stop()
        agent.close()
        # Shown by pytest only for a failing test.
        if op is not None:
            print(f"----- operator log ({op.log_path}) -----\n{_tail(op.log(), 300)}")
        if kube is not None:
            print(f"----- fake API server log ({kube.log_path}) -----\n{_tail(kube.log(), 200)}")


@pytest.fixture()
def cluster(origin, s3, tmp_path):  # noqa: F811
    """A fresh fake API server, one agent (team `vision`) and an operator between them; all stopped after."""
    with _running_cluster(origin, tmp_path) as c:
        yield c


def _prefix(what):
    return f"op-{what}-{secrets.token_hex(3)}/"


def _ready_claim(cluster, s3, ns="vision", name="resnet"):  # noqa: F811
    cluster.ready()
    cluster.namespace(ns, team="vision")
    prefix = _prefix("ready")
    put_dataset(s3, prefix, [MIB, MIB, MIB])
    cluster.dataclaim(ns, name, f"origin/{prefix}")
    dc = cluster.wait_phase(ns, name, "Ready")
    return dc


def test_a_dataclaim_gets_the_finalizer_becomes_ready_with_the_agents_claim_and_is_not_written_again(cluster, s3):  # noqa: F811
    dc = _ready_claim(cluster, s3)
    assert FINALIZER in dc["metadata"].get("finalizers", []), dc["metadata"]
    st = dc["status"]
    p = st["progress"]
    assert st["claimId"] and st["team"] == "vision", st
    assert p["blocksTotal"] > 0 and p["blocksHeld"] == p["blocksTotal"] == 3, p
    assert p["objectsDone"] == p["objectsTotal"] == 3 and p["bytesDone"] == p["bytesTotal"] == 3 * MIB, p
    assert st.get("observedGeneration") == dc["metadata"]["generation"], (st, dc["metadata"])
    assert {c["type"]: c["status"] for c in st["conditions"]} == {"Admitted": "True", "Ready": "True"}, st
    uid8 = dc["metadata"]["uid"].replace("-", "")[:8]

    c = cluster.agent.ok("GET", f"/v1/claims/{st['claimId']}")
    assert c["state"] == "ready" and c["team"] == "vision", c
    assert c["job"] == f"vision/resnet/{uid8}", c

    evs = cluster.wait("a Ready event", lambda: cluster.events("vision", "resnet"),
                       lambda evs: "Ready" in {e.get("reason") for e in evs})
    reasons = {e["reason"] for e in evs}
    assert reasons <= {"Admitted", "Staging", "Ready"}, evs
    assert all(e.get("type") == "Normal" and e["regarding"].get("kind") == "DataClaim" for e in evs), evs
    assert cluster.operator.metric('strata_operator_reconciles_total{outcome="ok"}') > 0

    # Nothing changes, so nothing is written: a reconcile of the unchanged claim finds the status equal.
    cluster.assert_not_written_again("DataClaim", dataclaims("vision", "resnet"))


def test_deleting_a_dataclaim_releases_its_claim_and_the_finalizer_goes(cluster, s3):  # noqa: F811
    dc = _ready_claim(cluster, s3)
    cid = dc["status"]["claimId"]
    deleting = cluster.api.delete(dataclaims("vision", "resnet"))
    assert deleting["metadata"].get("deletionTimestamp"), "the finalizer holds the object until the release"
    cluster.wait_gone("vision", "resnet")
    c = cluster.agent.ok("GET", f"/v1/claims/{cid}")
    assert c["state"] == "released", c
    assert "Released" in {e["reason"] for e in cluster.events("vision", "resnet")}


def test_a_namespace_without_a_team_label_fails_the_dataclaim_until_an_administrator_labels_it(cluster, s3):  # noqa: F811
    cluster.ready()
    cluster.namespace("noteam")
    prefix = _prefix("noteam")
    put_dataset(s3, prefix, [MIB])
    cluster.dataclaim("noteam", "orphan", f"origin/{prefix}")
    dc = cluster.wait_phase("noteam", "orphan", "Failed")
    assert "strata.dev/team" in dc["status"]["reason"], dc["status"]
    assert not dc["status"].get("claimId"), dc["status"]
    evs = cluster.wait("a Warning event", lambda: cluster.events("noteam", "orphan"),
                       lambda evs: any(e.get("type") == "Warning" for e in evs))
    assert any(e["type"] == "Warning" and "strata.dev/team" in (e.get("note") or "") for e in evs), evs
    assert cluster.agent_claims("noteam/") == []
    # An administrator labels the namespace: the DataClaim is looked at again and staged, nothing recreated.
    cluster.api.merge_patch(namespaces("noteam"), {"metadata": {"labels": {"strata.dev/team": "vision"}}})
    dc = cluster.wait_phase("noteam", "orphan", "Ready")
    assert dc["status"]["team"] == "vision" and dc["status"]["claimId"], dc["status"]


def test_a_deleted_dataclaim_whose_agent_is_gone_is_force_released_after_the_deadline(cluster, s3):  # noqa: F811
    _ready_claim(cluster, s3)
    cluster.agent.kill()
    cluster.api.delete(dataclaims("vision", "resnet"))
    # --force-release-after-secs is 3: the release is retried (the operator requeues failed reconciles after
    # 5 s), then the finalizer goes anyway.
    cluster.wait_gone("vision", "resnet")
    forced = [e for e in cluster.events("vision", "resnet") if e.get("reason") == "ForcedRelease"]
    assert forced and forced[0]["type"] == "Warning", cluster.events("vision", "resnet")
    assert cluster.operator.metric("strata_operator_forced_releases_total") == 1


def test_a_dataclaim_of_data_missing_on_the_origin_fails_with_the_agents_reason(cluster, s3):  # noqa: F811
    cluster.ready()
    cluster.namespace("vision", team="vision")
    prefix = _prefix("missing")
    cluster.dataclaim("vision", "ghost", f"origin/{prefix}")
    dc = cluster.wait_phase("vision", "ghost", "Failed")
    reason = dc["status"]["reason"]
    assert "datasets[0].location" in reason and "no object" in reason, dc["status"]
    assert not dc["status"].get("claimId"), dc["status"]
    evs = cluster.wait("a Warning event", lambda: cluster.events("vision", "ghost"),
                       lambda evs: any(e.get("type") == "Warning" for e in evs))
    assert [e["reason"] for e in evs if e["type"] == "Warning"] == ["Failed"], evs
    assert [c for c in cluster.agent_claims("vision/ghost/") if c["state"] != "released"] == []


def test_of_two_operators_only_the_lease_holder_reconciles_and_the_other_takes_over_when_it_dies(
        cluster, s3, tmp_path):  # noqa: F811
    _ready_claim(cluster, s3)
    holder = lambda: (cluster.api.get(leases("strata-system", "strata-operator")) or {}).get("spec", {})  # noqa: E731
    assert holder()["holderIdentity"] == "op-a", holder()
    b = Operator(cluster.agent.api, cluster.kube.kubeconfig(str(tmp_path / "kubeconfig-b")),
                 str(tmp_path / "operator-b.log"), holder="op-b")
    try:
        b.alive()
        # B waits as a candidate while A renews (twice since B started: B had its chances): it reconciles
        # nothing (its log says so) and A keeps the Lease.
        renewals = [holder().get("renewTime")]
        for _ in range(2):
            spec = cluster.wait("op-a to renew the Lease", holder,
                                lambda s: s.get("renewTime") not in renewals, timeout=4 * LEASE_SECS)
            renewals.append(spec.get("renewTime"))
        b.alive()
        assert holder()["holderIdentity"] == "op-a", holder()
        assert "waiting for the lease" in b.log() and "operator leading" not in b.log(), b.log()
        assert b.metric('strata_operator_reconciles_total{outcome="ok"}') == 0
        # A dies without a word: once its Lease runs out B takes it (one more transition) and reconciles.
        cluster.operator.proc.kill()
        cluster.operator.proc.wait()
        cluster.operator = b
        spec = cluster.wait("op-b to hold the Lease", holder, lambda s: s.get("holderIdentity") == "op-b")
        assert spec["leaseTransitions"] == 1, spec
        prefix = _prefix("failover")
        put_dataset(s3, prefix, [MIB])
        cluster.dataclaim("vision", "second", f"origin/{prefix}")
        cluster.wait_phase("vision", "second", "Ready")
        assert "operator leading" in b.log()
    finally:
        b.stop()
        print(f"----- operator B log -----\n{_tail(b.log(), 100)}")


# --- The pod admission webhook ------------------------------------------------------------------------------

CLAIM_LABEL = "strata.dev/claim"
HOSTNAME_LABEL = "kubernetes.io/hostname"
# The agent on a pod's own node (the strata-node Service of deploy/20-agents.yaml): the default --node-agent.
NODE_AGENT = "http://strata-node.strata-system:7070"
# The operator's namespace (the default --lease-namespace: Operator passes none and drops $POD_NAMESPACE), where
# it reads the EndpointSlices of the agents' Service.
OPERATOR_NAMESPACE = "strata-system"
# What the agents' EndpointSlices say (below): the ready agents' nodes, sorted.
READY_NODES = ["node-a", "node-b"]


def _endpoint_slice(name, service, endpoints):
    """An EndpointSlice as the endpoints controller writes one for `service`: (address, node, ready) each."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": OPERATOR_NAMESPACE,
                         "labels": {"kubernetes.io/service-name": service,
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "ports": [{"name": "api", "port": 7070, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": ready}, "nodeName": node}
                          for address, node, ready in endpoints]}


def _agents_endpoints(api, agent=None):
    """The agents as a cluster publishes them before the operator starts: ready on node-a and node-b, still
    starting (not ready) on node-c; and a slice of another Service in the namespace, which is not the agents'."""
    api.create(endpointslices(OPERATOR_NAMESPACE), _endpoint_slice(
        "strata-agents-7xk2p", "strata-agents",
        [("10.0.1.7", "node-b", True), ("10.0.0.3", "node-a", True), ("10.0.2.5", "node-c", False)]))
    api.create(endpointslices(OPERATOR_NAMESPACE), _endpoint_slice(
        "strata-operator-webhook-k2f9d", "strata-operator-webhook", [("10.0.9.1", "node-z", True)]))


def _self_signed(tmp_path):
    """A self-signed certificate and key for 127.0.0.1 (what cert-manager's Secret holds in a cluster, and
    the CA the webhook's caBundle would then be)."""
    cert, key = str(tmp_path / "webhook.crt"), str(tmp_path / "webhook.key")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "1", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"openssl req: {r.returncode}\n{r.stderr}"
    return cert, key


class Webhook:
    """The operator's admission webhook, called as the API server calls it: an AdmissionReview v1 of a Pod
    CREATE, POSTed over HTTPS, the server's certificate verified against the CA (the self-signed certificate
    itself) and its name (127.0.0.1)."""

    def __init__(self, port, ca):
        self.url = f"https://127.0.0.1:{port}/mutate-pods"
        self.tls = ssl.create_default_context(cafile=ca)

    def review(self, namespace, pod):
        """The webhook's AdmissionResponse for the creation of `pod` in `namespace`."""
        uid = str(uuid.uuid4())
        gvk, gvr = {"group": "", "version": "v1", "kind": "Pod"}, {"group": "", "version": "v1", "resource": "pods"}
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
                            "name": pod["metadata"].get("name", ""), "namespace": namespace, "operation": "CREATE",
                            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller",
                                         "groups": ["system:serviceaccounts", "system:authenticated"]},
                            "object": pod, "oldObject": None, "dryRun": False,
                            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}}
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=self.tls, timeout=10) as r:
            assert r.status == 200, r.status
            review = json.loads(r.read())
        assert (review.get("apiVersion"), review.get("kind")) == ("admission.k8s.io/v1", "AdmissionReview"), review
        resp = review["response"]
        assert resp["uid"] == uid, ("the response answers another request", uid, resp)
        return resp


def _patched(pod, resp):
    """(`pod` with the response's JSON patch applied as the API server applies it, the patch's operations);
    (`pod`, None) when the response has no patch."""
    raw = resp.get("patch")
    if raw is None:
        return pod, None
    assert resp.get("patchType") == "JSONPatch", resp
    # `patch` is []byte in the API's Go types: in JSON, base64 text, which is what the API server decodes
    # (kube-rs's AdmissionResponse alone would send an array of numbers; the operator rewrites it).
    assert isinstance(raw, str), ("the patch must be base64 text", raw)
    data = base64.b64decode(raw, validate=True)
    ops = json.loads(data)
    return jsonpatch.apply_patch(pod, ops), ops


def _denial(resp):
    """The message of a denied AdmissionResponse (what `kubectl describe job` shows)."""
    assert resp["allowed"] is False, resp
    assert resp.get("patch") is None, ("a denial patches nothing", resp)
    return (resp.get("status") or {}).get("message") or ""


def _job_pod(namespace, claim):
    """A pod as a Job's controller creates it and a mutating webhook sees it, after the API server's
    defaulting: generateName and no name yet; a container that sets STRATA_AGENT itself, and the pod's own
    scheduling preference."""
    labels = {"job-name": "train", "batch.kubernetes.io/job-name": "train"}
    if claim is not None:
        labels[CLAIM_LABEL] = claim

    def container(name, image, env=None):
        c = {"name": name, "image": image, "imagePullPolicy": "IfNotPresent", "resources": {},
             "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
        if env is not None:
            c["env"] = env
        return c

    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "train-", "namespace": namespace, "labels": labels,
                         "creationTimestamp": None},
            "spec": {"restartPolicy": "Never", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
                     "serviceAccountName": "default", "securityContext": {}, "terminationGracePeriodSeconds": 30,
                     "enableServiceLinks": True, "priority": 0,
                     "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                      "effect": "NoExecute", "tolerationSeconds": 300}],
                     "initContainers": [container("fetch-code", "busybox")],
                     "containers": [container("train", "pytorch/pytorch", [{"name": "EPOCHS", "value": "90"}]),
                                    container("proxy", "envoyproxy/envoy",
                                              [{"name": "STRATA_AGENT", "value": "http://127.0.0.1:7070"}])],
                     "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                         {"weight": 10, "preference": {"matchExpressions": [
                             {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]}}]}}},
            "status": {}}


def _env_or_affinity(path):
    """Whether a JSON patch path is in a container's env (/spec/containers/N/env...) or the pod's affinity."""
    parts = path.split("/")
    return parts[1:3] == ["spec", "affinity"] or (
        parts[1:2] == ["spec"] and parts[2:3] in (["containers"], ["initContainers"]) and parts[4:5] == ["env"])


def _env(container):
    return {e["name"]: e.get("value") for e in container.get("env") or []}


@pytest.fixture()
def webhook_cluster(origin, s3, tmp_path):  # noqa: F811
    """`cluster`, with the agents' EndpointSlices in the API before the operator starts, and the operator
    serving the webhook (`.webhook`) with a self-signed certificate."""
    cert, key = _self_signed(tmp_path)
    port = free_port()
    with _running_cluster(origin, tmp_path, before_operator=_agents_endpoints, webhook=(port, cert, key)) as c:
        c.webhook = Webhook(port, cert)
        c.webhook_port, c.webhook_files = port, (cert, key)
        yield c


def test_a_pod_naming_a_ready_claim_is_admitted_with_its_environment_and_affinity_toward_the_cache(
        webhook_cluster, s3):  # noqa: F811
    cluster = webhook_cluster
    dc = _ready_claim(cluster, s3)
    st = dc["status"]
    # Where the data is: the nodes of the ready endpoints of strata-agents (node-c's agent is not ready; node-z is
    # another Service's), known from the first Ready write on.
    assert st["nodes"] == READY_NODES, st
    assert st["claimId"] and st["env"].get("STRATA_CLAIM") == st["claimId"], st

    pod = _job_pod("vision", "resnet")
    resp = cluster.webhook.review("vision", pod)
    assert resp["allowed"] is True, resp
    out, ops = _patched(pod, resp)
    assert ops, resp
    # The patch touches the containers' environment and the affinity, nothing else.
    assert all(_env_or_affinity(op["path"]) for op in ops), ops
    assert out["metadata"] == pod["metadata"]

    for c in out["spec"]["initContainers"] + out["spec"]["containers"]:
        names = [e["name"] for e in c["env"]]
        assert len(names) == len(set(names)), (c["name"], names)
        env = _env(c)
        # The container that names its own agent keeps it; every other gets the agent of its node.
        assert env["STRATA_AGENT"] == ("http://127.0.0.1:7070" if c["name"] == "proxy" else NODE_AGENT), (c["name"], env)
        assert env["STRATA_CLAIM"] == st["claimId"], (c["name"], env)
        # The rest of the claim's environment as its status has it. Its STRATA_AGENT is the agent the operator
        # made the claim on (its --agent: the strata-api Service in a cluster); a pod reads through its node's.
        for k, v in st["env"].items():
            if k != "STRATA_AGENT":
                assert env.get(k) == v, (c["name"], k, env)
    assert _env(out["spec"]["containers"][0])["EPOCHS"] == "90"

    # Preferred, not required, by default: the scheduler weighs the cache's nodes, next to the pod's own terms.
    na = out["spec"]["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in na, na
    assert na["preferredDuringSchedulingIgnoredDuringExecution"] == [
        pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0],
        {"weight": 100, "preference": {"matchExpressions": [
            {"key": HOSTNAME_LABEL, "operator": "In", "values": READY_NODES}]}}], na

    # Reinvoked (reinvocationPolicy IfNeeded, after another webhook), the admitted pod stays as it is.
    resp = cluster.webhook.review("vision", out)
    assert resp["allowed"] is True, resp
    assert _patched(out, resp)[0] == out, resp

    # The admitted pod is what the API server then stores: a well-formed Pod (the fake server stores it as
    # sent, and validates nothing but its JSON; structure_problems checks names, containers and env entries).
    created = cluster.api.create(resource_path("v1", "pods", "vision"), out)
    stored = cluster.api.get(resource_path("v1", "pods", "vision", created["metadata"]["name"]))
    assert stored["spec"] == out["spec"] and stored["metadata"]["labels"][CLAIM_LABEL] == "resnet", stored
    assert structure_problems(stored) == [], structure_problems(stored)

    # requireCacheAffinity: the pod may only run where the data is, in every way it may schedule.
    cluster.api.create(dataclaims("vision"), {
        "apiVersion": "strata.dev/v1alpha1", "kind": "DataClaim",
        "metadata": {"name": "resnet-strict", "namespace": "vision"},
        "spec": {"datasets": [{"name": "train", "location": dc["spec"]["datasets"][0]["location"]}],
                 "requireCacheAffinity": True}})
    strict = cluster.wait_phase("vision", "resnet-strict", "Ready")["status"]
    assert strict["nodes"] == READY_NODES, strict
    pod = _job_pod("vision", "resnet-strict")
    out, _ = _patched(pod, cluster.webhook.review("vision", pod))
    na = out["spec"]["affinity"]["nodeAffinity"]
    assert na["requiredDuringSchedulingIgnoredDuringExecution"] == {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": HOSTNAME_LABEL, "operator": "In", "values": READY_NODES}]}]}, na
    assert na["preferredDuringSchedulingIgnoredDuringExecution"] == \
        pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"], na
    assert _env(out["spec"]["containers"][0])["STRATA_CLAIM"] == strict["claimId"] != st["claimId"]


def test_a_pod_is_denied_until_its_claim_is_ready_and_one_naming_none_is_admitted_untouched(
        webhook_cluster, s3):  # noqa: F811
    cluster = webhook_cluster
    cluster.ready()
    cluster.namespace("vision", team="vision")
    hook = cluster.webhook

    # No label: admitted as it is (the MutatingWebhookConfiguration's objectSelector would not even send it).
    resp = hook.review("vision", _job_pod("vision", None))
    assert resp["allowed"] is True and resp.get("patch") is None and resp.get("patchType") is None, resp

    # A DataClaim that does not exist: denied, naming it and the namespace it was looked for in.
    msg = _denial(hook.review("vision", _job_pod("vision", "nonesuch")))
    assert '"nonesuch"' in msg and "namespace vision" in msg, msg

    # Failed (its data is not on the origin): denied with the reason the DataClaim gives.
    cluster.dataclaim("vision", "ghost", f"origin/{_prefix('missing')}")
    reason = cluster.wait_phase("vision", "ghost", "Failed")["status"]["reason"]
    msg = _denial(hook.review("vision", _job_pod("vision", "ghost")))
    assert "DataClaim ghost failed" in msg and reason in msg, (msg, reason)

    # Not Ready yet. The agent is stopped (SIGSTOP) so that the operator, which has taken the DataClaim (its
    # finalizer is on), waits on its first call to the agent and writes no status meanwhile: the DataClaim stays
    # Pending for as long as the test looks, instead of racing a staging of a few milliseconds.
    prefix = _prefix("slow")
    put_dataset(s3, prefix, [MIB])
    cluster.agent.proc.send_signal(signal.SIGSTOP)
    try:
        cluster.dataclaim("vision", "slow", f"origin/{prefix}")
        taken = cluster.wait("the operator to take DataClaim slow", lambda: cluster.get("vision", "slow"),
                             lambda dc: FINALIZER in (dc or {}).get("metadata", {}).get("finalizers", []))
        assert not taken.get("status"), taken
        msg = _denial(hook.review("vision", _job_pod("vision", "slow")))
        assert "DataClaim slow is Pending" in msg and "once it is Ready" in msg, msg
        # Staging, with the progress the operator writes while the agent stages: the denial says how far it is.
        cluster.api.merge_patch(dataclaims("vision", "slow", "status"), {"status": {
            "phase": "Staging",
            "progress": {"bytesDone": MIB // 4, "bytesTotal": MIB, "objectsDone": 0, "objectsTotal": 1,
                         "blocksHeld": 0, "blocksTotal": 1, "summary": "256 KiB/1.0 MiB (25%)"}}})
        msg = _denial(hook.review("vision", _job_pod("vision", "slow")))
        assert f"DataClaim slow is Staging (25%: {MIB // 4} of {MIB} bytes, 0 of 1 objects)" in msg, msg
    finally:
        cluster.agent.proc.send_signal(signal.SIGCONT)


def test_a_renewed_certificate_is_served_without_a_restart_and_a_broken_one_is_not(webhook_cluster, tmp_path):
    # cert-manager renews the Secret and the kubelet swaps the mounted files; a webhook still serving the old
    # certificate after it expires would fail every labelled pod closed. The operator looks at the files again
    # (every --webhook-reload-secs, 1 s here) and serves the new pair on the next connection.
    cluster = webhook_cluster
    cert, key = cluster.webhook_files
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": "vision"},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    assert cluster.webhook.review("vision", plain)["allowed"] is True
    old_ca = str(tmp_path / "old-ca.crt")
    shutil.copy(cert, old_ca)
    renewed_dir = tmp_path / "renewed"
    renewed_dir.mkdir()
    new_cert, new_key = _self_signed(renewed_dir)
    new_ca = str(tmp_path / "new-ca.crt")
    shutil.copy(new_cert, new_ca)
    os.replace(new_key, key)
    os.replace(new_cert, cert)
    renewed = Webhook(cluster.webhook_port, new_ca)

    def tls_refused(e):
        return isinstance(e, ssl.SSLError) or isinstance(getattr(e, "reason", None), ssl.SSLError)

    def serves_the_new_one():
        try:
            return renewed.review("vision", plain)["allowed"] is True
        except (ssl.SSLError, urllib.error.URLError) as e:
            assert tls_refused(e), e
            return False
    deadline = time.time() + TIMEOUT
    while not serves_the_new_one():
        assert time.time() < deadline, "the renewed certificate is not served:\n" + cluster.operator.log()[-3000:]
        time.sleep(0.3)
    with pytest.raises((ssl.SSLError, urllib.error.URLError)) as e:
        Webhook(cluster.webhook_port, old_ca).review("vision", plain)
    assert tls_refused(e.value), e.value
    # A half-written renewal (a key that is not PEM): the last good pair stays in service.
    with open(key, "w") as f:
        f.write("not a key\n")
    # The files are looked at again on a connection (at most once a second): every review keeps being served
    # with the last good pair until one has looked and refused the broken one.
    def served_after_refusal():
        assert renewed.review("vision", plain)["allowed"] is True
        return "does not load; keeping the last one" in cluster.operator.log()
    cluster.wait("the operator to refuse the broken pair", served_after_refusal, bool)
    assert renewed.review("vision", plain)["allowed"] is True


# --- Dataset volumes: a Job's pod gets its DataClaim's datasets as volumes, mounted on the node it is bound to ---

from test_claims import _ensure_group_member, _ensure_outsider, _fuse_or_skip, _mounted, _read_as  # noqa: E402

JOB_USER, OUTSIDER = "op-vision-job", "op-outsider"


def _agent_on_node_a(api, agent):
    """The agents as the cluster publishes them: this test's real agent ready on node-a (its loopback address
    and API port), one still starting on node-c."""
    port = int(agent.api.rsplit(":", 1)[1])
    sl = _endpoint_slice("strata-agents-m0unt", "strata-agents",
                         [("127.0.0.1", "node-a", True), ("10.0.2.5", "node-c", False)])
    sl["ports"][0]["port"] = port
    api.create(endpointslices(OPERATOR_NAMESPACE), sl)


@pytest.fixture()
def mount_cluster(origin, s3, tmp_path):  # noqa: F811
    """`webhook_cluster` whose agents' endpoint is the real agent, on node-a, and whose operator has the agents
    mount DataClaims under a root of the test's (`.mount_root`, readable by the job's user)."""
    _fuse_or_skip()
    _ensure_group_member("vision", JOB_USER)
    _ensure_outsider(OUTSIDER)
    root = tempfile.mkdtemp(prefix="strata-k8s-mounts-")
    os.chmod(root, 0o755)
    # As the agents' hostPath is on a node (Bidirectional propagation needs it shared): mounts made under it
    # reach the mount namespaces that have a slave copy of it, as pods' HostToContainer volumes do.
    subprocess.run(["mount", "--bind", root, root], check=True)
    subprocess.run(["mount", "--make-shared", root], check=True)
    cert, key = _self_signed(tmp_path)
    port = free_port()
    try:
        with _running_cluster(origin, tmp_path, before_operator=_agent_on_node_a, webhook=(port, cert, key),
                              extra_args=["--mount-root", root, "--mounts-image", "registry.local/strata:test"]) as c:
            c.webhook = Webhook(port, cert)
            c.mount_root = root
            yield c
    finally:
        points = [line.split()[1] for line in open("/proc/mounts").read().splitlines()]
        for point in sorted((p for p in points if p.startswith(root)), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _sample_job_pod():
    """The pod the Job controller creates from deploy/samples/job.yaml's template."""
    with open(os.path.join(ROOT, "deploy", "samples", "job.yaml")) as f:
        job = yaml.safe_load(f)
    tpl = job["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{job['metadata']['name']}-", "namespace": job["metadata"]["namespace"],
                         "labels": dict(tpl["metadata"]["labels"], **{"job-name": job["metadata"]["name"]})},
            "spec": dict(tpl["spec"], securityContext={}), "status": {}}


# A pod's container as the runtime makes it (simplified): its own mount namespace, the node's mounts a slave copy
# (HostToContainer), the hostPath bound at the container's path; then what the pod runs: the strata-mounts init
# container's `strata wait-mounts`, and the job reading every file as its user.
CONTAINER = '''
mount --make-rslave "$ROOT" && mount --rbind "$NODE_PATH" "$CTR" && mount --make-rslave "$CTR" && touch "$BOUND" &&
"$STRATA" wait-mounts --timeout-secs 60 "$CTR" >&2 &&
runuser -u "$JOB_USER" -- /usr/bin/python3 -c '
import hashlib, json, os, sys
r = sys.argv[1]
print(json.dumps({os.path.relpath(os.path.join(d, f), r): hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
                  for d, _, fs in os.walk(r) for f in fs}))' "$CTR"
'''


def _container(root, node_path, tmp_path):
    """Start CONTAINER for `node_path`; returns (process, its path, the file it touches once bound)."""
    ctr = tempfile.mkdtemp(prefix="strata-k8s-ctr-")
    os.chmod(ctr, 0o755)
    bound = str(tmp_path / "container-bound")
    env = dict(os.environ, ROOT=root, NODE_PATH=node_path, CTR=ctr, BOUND=bound, STRATA=STRATA, JOB_USER=JOB_USER)
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "unchanged", "sh", "-c", CONTAINER],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, ctr, bound


def _wait_mounts(path, timeout):
    return subprocess.run([STRATA, "wait-mounts", "--timeout-secs", str(timeout), path],
                          capture_output=True, text=True, timeout=timeout + 30)


def test_a_job_pod_gets_its_datasets_as_volumes_mounted_on_its_node_and_reads_them_byte_exact(
        mount_cluster, s3, tmp_path):  # noqa: F811
    cluster = mount_cluster
    cluster.ready()
    cluster.namespace("vision", team="vision")
    prefix = _prefix("vol")
    sizes = [3 * MIB + 5, 17, 0, MIB, 2 * MIB, 100]
    objs = put_dataset(s3, prefix, sizes)
    cluster.api.create(dataclaims("vision"), {
        "apiVersion": "strata.dev/v1alpha1", "kind": "DataClaim",
        "metadata": {"name": "resnet-run-7", "namespace": "vision"},
        "spec": {"datasets": [{"name": "train", "location": f"origin/{prefix}", "mountPath": "/data/train"}]},
    })
    dc = cluster.wait_phase("vision", "resnet-run-7", "Ready")
    st = dc["status"]
    uid8 = dc["metadata"]["uid"].replace("-", "")[:8]
    node_path = f"{cluster.mount_root}/vision/resnet-run-7-{uid8}/train"
    assert st["mounts"] == [{"name": "train", "mountPath": "/data/train", "nodePath": node_path}], st
    gid = int(subprocess.run(["getent", "group", "vision"], capture_output=True, text=True).stdout.split(":")[2])
    assert st["mountGroup"] == gid, st
    assert st["nodes"] == ["node-a"], st
    # Accounted to the job: every byte of the dataset staged.
    assert st["usage"]["stagedBytes"] + st["usage"]["stagedCachedBytes"] == sum(sizes), st
    # The agent that staged it mounted it on its node; take it down, as on a node the pod lands on that is not
    # the staging agent's (the claim's mounts are made per node, on demand).
    assert _mounted(node_path), "Ready means mounted on the staging agent's node"
    cluster.agent.ok("POST", f"/v1/claims/{st['claimId']}/detach")
    assert not _mounted(node_path)
    # What the pod's init container runs: without the mount it does not finish, and says what it waits for.
    r = _wait_mounts(node_path, 1)
    assert r.returncode != 0 and node_path in r.stderr and "not Strata mounts" in r.stderr, r

    # The sample Job's pod (deploy/samples/job.yaml), as the Job controller creates it and the API server
    # admits it through the webhook.
    pod = _sample_job_pod()
    assert pod["metadata"]["labels"][CLAIM_LABEL] == "resnet-run-7"
    resp = cluster.webhook.review("vision", pod)
    assert resp["allowed"] is True, resp
    out, _ = _patched(pod, resp)
    spec = out["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["strata-train"]["hostPath"] == {"path": node_path, "type": "Directory"}, vols
    want = {"name": "strata-train", "mountPath": "/data/train", "readOnly": True, "mountPropagation": "HostToContainer"}
    for c in spec["containers"] + spec["initContainers"]:
        assert want in c["volumeMounts"], c
    init = spec["initContainers"][0]
    assert init["name"] == "strata-mounts" and init["image"] == "registry.local/strata:test", init
    assert init["args"] == ["wait-mounts", "--timeout-secs", "600", "/data/train"], init
    assert gid in spec["securityContext"]["supplementalGroups"], spec["securityContext"]
    env = _env(spec["containers"][0])
    assert env["STRATA_CLAIM"] == st["claimId"] and env["STRATA_AGENT"] == NODE_AGENT, env
    # The dataset's path as the pod's containers see it, not the node's.
    assert env["STRATA_MOUNT_TRAIN"] == "/data/train", env
    # Scheduled near the cache: node-a, where the agent holding the claim's blocks is.
    pref = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert {"weight": 100, "preference": {"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}} in pref, pref

    # The pod's container starts on node-a with its volume bound while the node has no mount yet: it waits.
    container, ctr, bound = _container(cluster.mount_root, node_path, tmp_path)
    cluster.wait("the container's volume bound", lambda: os.path.exists(bound) or container.poll(), bool)
    assert container.poll() is None, container.communicate()
    # The scheduler binds the pod to node-a: the operator has node-a's agent mount the claim there.
    out["metadata"]["name"] = "train-x7k2q"
    out["spec"]["nodeName"] = "node-a"
    cluster.api.create(resource_path("v1", "pods", "vision"), out)
    cluster.wait("the claim mounted on node-a", lambda: (cluster.get("vision", "resnet-run-7").get("status") or {}),
                 lambda s: s.get("mountedNodes") == ["node-a"])
    assert _mounted(node_path)
    # The mount reached the waiting container through propagation: its init step returned and the job read
    # every file byte-exact as the job's user (the mounts' group is among its groups, as the pod's
    # supplementalGroups give it).
    stdout, stderr = container.communicate(timeout=120)
    assert container.returncode == 0, (container.returncode, stderr)
    assert json.loads(stdout) == {k[len(prefix):]: d for k, d in objs.items()}, stdout
    shutil.rmtree(ctr, ignore_errors=True)
    # A user of another team cannot read it.
    first = os.path.join(node_path, next(iter(objs))[len(prefix):])
    assert _read_as(OUTSIDER, first).returncode != 0
    # Not written again while nothing changes (mounts included).
    cluster.assert_not_written_again("DataClaim", dataclaims("vision", "resnet-run-7"))

    # The DataClaim deleted: the claim is released and its mount goes; the dataset stays.
    cluster.api.delete(dataclaims("vision", "resnet-run-7"))
    cluster.wait_gone("vision", "resnet-run-7")
    cluster.wait("the mount to go", lambda: _mounted(node_path), lambda m: not m)
    assert len(s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]) == len(objs)


def test_a_pod_bound_to_a_node_without_a_ready_agent_is_a_warning_event_and_no_mount(mount_cluster, s3):  # noqa: F811
    cluster = mount_cluster
    cluster.ready()
    cluster.namespace("vision", team="vision")
    prefix = _prefix("nodeless")
    put_dataset(s3, prefix, [MIB, 10])
    cluster.api.create(dataclaims("vision"), {
        "apiVersion": "strata.dev/v1alpha1", "kind": "DataClaim",
        "metadata": {"name": "nodeless", "namespace": "vision"},
        "spec": {"datasets": [{"name": "train", "location": f"origin/{prefix}", "mountPath": "/data/train"}]},
    })
    cluster.wait_phase("vision", "nodeless", "Ready")
    out, _ = _patched(_job_pod("vision", "nodeless"), cluster.webhook.review("vision", _job_pod("vision", "nodeless")))
    out["metadata"]["name"] = "train-c0c0c"
    out["spec"]["nodeName"] = "node-c"  # its agent is not ready
    cluster.api.create(resource_path("v1", "pods", "vision"), out)
    ev = cluster.wait("a MountFailed event", lambda: cluster.events("vision", "nodeless"),
                      lambda evs: any(e.get("reason") == "MountFailed" for e in evs))
    note = next(e for e in ev if e.get("reason") == "MountFailed")["note"]
    assert "node-c" in note and "no ready Strata agent" in note, note
    assert "node-c" not in (cluster.get("vision", "nodeless")["status"].get("mountedNodes") or [])


# ---------------------------------------------------------------------------------------------------------------
# Datasets: counted on the agents, prefetched or pinned by a claim that follows the source's newest version


@pytest.fixture()
def dataset_cluster(origin, s3, tmp_path):  # noqa: F811
    """`cluster` whose agents' endpoint is the real agent, on node-a, and whose operator counts Datasets every
    second."""
    with _running_cluster(origin, tmp_path, before_operator=_agent_on_node_a,
                          extra_args=["--dataset-poll-secs", "1"]) as c:
        yield c


def _dataset(cluster, ns, name, source, mode="prefetch", **cache):
    return cluster.api.create(datasets(ns), {
        "apiVersion": "strata.dev/v1alpha1", "kind": "Dataset", "metadata": {"name": name, "namespace": ns},
        "spec": {"source": source, "cache": {"mode": mode, **cache}}})


def _condition(ds, type_):
    for c in (ds or {}).get("status", {}).get("conditions", []):
        if c["type"] == type_:
            return c
    return {}


def _wait_dataset(cluster, ns, name, what, check, timeout=TIMEOUT):
    return cluster.wait(f"Dataset {ns}/{name}: {what}", lambda: cluster.api.get(datasets(ns, name)), check,
                        timeout=timeout)


def test_a_prefetched_dataset_is_staged_counted_per_version_followed_to_its_newest_version_and_released(
        dataset_cluster, s3):  # noqa: F811
    cluster = dataset_cluster
    cluster.ready()
    cluster.namespace("vision", team="vision")
    prefix = _prefix("dataset")
    put_dataset(s3, prefix, [MIB, 2 * MIB, MIB + 17])
    total = 4 * MIB + 17
    _dataset(cluster, "vision", "imagenet", f"origin/{prefix}")
    ds = _wait_dataset(cluster, "vision", "imagenet", "Ready and Cached",
                       lambda d: _condition(d, "Ready").get("status") == "True"
                       and _condition(d, "Cached").get("status") == "True")
    st = ds["status"]
    assert FINALIZER in ds["metadata"]["finalizers"], ds["metadata"]
    assert st["team"] == "vision" and st["cachedFraction"] == "100%", st
    [v1] = st["versions"]
    assert (v1["objects"], v1["totalBytes"], v1["cachedBytes"]) == (3, total, total), st
    assert st["nodes"] == ["node-a"], st
    assert _condition(ds, "Ready")["reason"] == "Staged", st
    cid = st["claimId"]
    assert st["claimVersion"] == v1["version"], st
    claim = cluster.agent.ok("GET", f"/v1/claims/{cid}")
    assert claim["state"] == "ready" and claim["job"].startswith("vision/dataset:imagenet/"), claim
    assert claim["progress"]["blocks_held"] == claim["progress"]["blocks_total"], claim
    assert {e["reason"] for e in cluster.events("vision", "imagenet")} >= {"Staged", "Cached"}

    # Nothing changes: nothing is written, though the operator looks again.
    cluster.assert_not_written_again("Dataset", datasets("vision", "imagenet"))

    # The source gains an object: a new version, staged by a new claim; the old claim is released.
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}zz-new one+.bin", Body=os.urandom(MIB))
    ds = _wait_dataset(cluster, "vision", "imagenet", "the newest version staged",
                       lambda d: d["status"]["versions"][0]["version"] != v1["version"]
                       and _condition(d, "Cached").get("status") == "True"
                       and _condition(d, "Ready").get("reason") == "Staged")
    st = ds["status"]
    assert st["versions"][0]["objects"] == 4 and st["versions"][0]["cachedBytes"] == total + MIB, st
    assert st["claimId"] != cid and st["claimVersion"] == st["versions"][0]["version"], st
    assert cluster.agent.ok("GET", f"/v1/claims/{cid}")["state"] == "released"

    # Cache mode none: the claim goes, the cached blocks stay counted.
    cid2 = st["claimId"]
    cluster.api.merge_patch(datasets("vision", "imagenet"), {"spec": {"cache": {"mode": "none"}}})
    ds = _wait_dataset(cluster, "vision", "imagenet", "no claim", lambda d: not d["status"].get("claimId"))
    assert _condition(ds, "Ready")["reason"] == "Listed", ds["status"]
    assert cluster.agent.ok("GET", f"/v1/claims/{cid2}")["state"] == "released"

    # Deleted: the object goes (no claim to release), the data stays on the origin.
    cluster.api.merge_patch(datasets("vision", "imagenet"), {"spec": {"cache": {"mode": "pin"}}})
    ds = _wait_dataset(cluster, "vision", "imagenet", "pinned",
                       lambda d: _condition(d, "Ready").get("reason") == "Staged" and d["status"].get("claimId"))
    cid3 = ds["status"]["claimId"]
    assert cluster.agent.ok("GET", f"/v1/claims/{cid3}")["datasets"][0]["mode"] == "pin"
    cluster.api.delete(datasets("vision", "imagenet"))
    cluster.wait("the Dataset gone", lambda: cluster.api.get(datasets("vision", "imagenet")), lambda d: d is None)
    assert cluster.agent.ok("GET", f"/v1/claims/{cid3}")["state"] == "released"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]]
    assert len(keys) == 4, keys


def test_a_dataset_that_cannot_be_staged_says_why_and_is_not_staged_again_until_its_spec_changes(
        dataset_cluster, s3):  # noqa: F811
    cluster = dataset_cluster
    cluster.ready()
    cluster.namespace("vision", team="vision")
    cluster.namespace("noteam")
    prefix = _prefix("dataset-no")
    put_dataset(s3, prefix, [2 * MIB, 2 * MIB])

    # Refused by the operator: each with the field and a Warning event; no claim.
    _dataset(cluster, "noteam", "orphan", f"origin/{prefix}")
    _dataset(cluster, "vision", "twice", f"origin/{prefix}", replicas=9)
    _dataset(cluster, "vision", "ghost", f"origin/{_prefix('absent')}")
    for ns, name, words in [("noteam", "orphan", "strata.dev/team"), ("vision", "twice", "spec.cache.replicas"),
                            ("vision", "ghost", "spec.source")]:
        ds = _wait_dataset(cluster, ns, name, "refused", lambda d: _condition(d, "Ready").get("reason") == "Refused")
        assert words in ds["status"]["reason"], ds["status"]
        assert not ds["status"].get("claimId"), ds["status"]
        evs = cluster.wait("a Warning event", lambda: cluster.events(ns, name),
                           lambda evs: any(e.get("type") == "Warning" for e in evs))
        assert any(words in (e.get("note") or "") for e in evs), evs
    assert [c for c in cluster.agent_claims("") if "dataset:" in c["job"]] == []

    # Refused by the agents (a pin over the team's cache quota): the reason, once; not submitted again while
    # the source and the spec stay as they are.
    cluster.agent.ok("PUT", "/v1/quotas/vision/cache", {"hard_bytes": MIB})
    _dataset(cluster, "vision", "big", f"origin/{prefix}", mode="pin")
    ds = _wait_dataset(cluster, "vision", "big", "staging failed",
                       lambda d: _condition(d, "Ready").get("reason") == "StagingFailed")
    st = ds["status"]
    assert "datasets[0] (pin)" in st["reason"] and st["failedVersion"] == st["versions"][0]["version"], st
    assert st["cachedFraction"] == "0%" and _condition(ds, "Cached")["status"] == "False", st
    # Looked at again (touched), it stays as it is: no status write, no new claim.
    cluster.assert_not_written_again("Dataset", datasets("vision", "big"))
    jobs = [c for c in cluster.agent_claims("vision/dataset:big/")]
    assert len(jobs) == 1 and jobs[0]["state"] == "released", jobs
    # The quota raised and the spec touched: staged and pinned.
    cluster.agent.ok("PUT", "/v1/quotas/vision/cache", {"hard_bytes": 64 * MIB})
    cluster.api.merge_patch(datasets("vision", "big"), {"spec": {"cache": {"stageDeadlineSeconds": 600}}})
    ds = _wait_dataset(cluster, "vision", "big", "staged", lambda d: _condition(d, "Ready").get("reason") == "Staged")
    assert ds["status"]["cachedFraction"] == "100%" and not ds["status"].get("failedVersion"), ds["status"]
