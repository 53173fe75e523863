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
"""
import os
import secrets
import signal
import subprocess
import time
import urllib.request

import pytest

from conftest import ADMIN_TOKEN, STRATA, free_port, wait_port
from test_claims import MIB, Agent, put_dataset, s3  # noqa: F401  (s3 is a fixture)
from kube_api import FakeKubeApi, dataclaims, events, leases, namespaces

FINALIZER = "strata.dev/release"
FORCE_RELEASE_AFTER_SECS = 3
LEASE_SECS = 3
TIMEOUT = 30


class Operator:
    """One `strata operator run` against the fake API server and one agent; its log in a file."""

    def __init__(self, agent_api, kubeconfig, log_path, holder="op-a"):
        self.metrics_port = free_port()
        self.metrics = f"http://127.0.0.1:{self.metrics_port}"
        self.log_path = log_path
        self._log = open(log_path, "ab")
        env = dict(os.environ, STRATA_TOKEN=ADMIN_TOKEN, KUBECONFIG=kubeconfig, RUST_LOG="info",
                   # the CLI's log filter is STRATA_LOG; kube-runtime's watcher says why a list/watch failed at debug
                   STRATA_LOG="info,strata_k8s=debug,kube_runtime=debug,kube_client=info")
        for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "STRATA_AGENT"):
            env.pop(k, None)
        self.proc = subprocess.Popen(
            [STRATA, "operator", "run", "--agent", agent_api, "--metrics-addr", f"127.0.0.1:{self.metrics_port}",
             "--staging-poll-ms", "200", "--force-release-after-secs", str(FORCE_RELEASE_AFTER_SECS), "--refused-retry-secs", "2",
             "--lease-holder", holder, "--lease-secs", str(LEASE_SECS)],
            stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL, env=env)
        # A start that fails is recorded, not raised: each test asserts it first (`Cluster.ready`), so a broken
        # operator is a failed test with the reason, not a fixture error.
        self.start_error = None
        try:
            wait_port(self.metrics_port, self.proc)
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

    def agent_claims(self, job_prefix):
        """Every claim on the agent (live and released) whose job starts with `job_prefix`."""
        out = {}
        for q in ("", "?released=true"):
            out.update((c["id"], c) for c in self.agent.ok("GET", "/v1/claims" + q) if c["job"].startswith(job_prefix))
        return list(out.values())


def _tail(text, lines):
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture()
def cluster(origin, s3, tmp_path):  # noqa: F811
    """A fresh fake API server, one agent (team `vision`) and an operator between them; all stopped after."""
    agent = Agent(origin)
    kube = op = None
    try:
        s, v = agent.call("POST", "/v1/teams", {"name": "vision"}, token=ADMIN_TOKEN)
        assert s in (200, 201, 409), (s, v)
        kube = FakeKubeApi(log_path=str(tmp_path / "kube-api.log"))
        op = Operator(agent.api, kube.kubeconfig(str(tmp_path / "kubeconfig")), str(tmp_path / "operator.log"))
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

    # Nothing changes, so nothing is written: the follow-up reconciles of the last write find the status equal.
    rv = cluster.get("vision", "resnet")["metadata"]["resourceVersion"]
    time.sleep(3)
    cluster.operator.alive()
    after = cluster.get("vision", "resnet")
    assert after["metadata"]["resourceVersion"] == rv, (
        "the operator wrote an unchanged DataClaim again", rv, after["metadata"], after.get("status"))


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
        # B waits as a candidate while A renews: it reconciles nothing (its log says so) and A keeps the Lease.
        time.sleep(2 * LEASE_SECS)
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
