"""Strata's Slurm integration on a real single-node Slurm 22.05 (tests/python/slurm.py) with Strata's
contrib/slurm/burst_buffer.lua, a `strata serve` agent in front of a real S3 server (moto), and batch jobs
submitted as a user (nobody), as a site runs them.

Covered: a job with one `#BB_LUA` line starts only after its claim is ready, finds its environment, reads every
file byte-exact through the cache with no origin read, and its claim is released under its job id with the
accounting (the claim and its staging in the job's AdminComment, set before the job runs: Slurm 22.05 refuses
updates to a finished job); an inline claim; scancel during staging and during the run releases everything;
a claim that cannot be had (empty dataset, quota, a user outside the team's group, a dataset larger than the
cache) keeps the job pending with a readable reason, then fails it; a bad claim is refused at sbatch naming the
field, and a claim file the user cannot read is refused without its contents reaching the user; `strata doctor slurm` on this site and with the agent gone.

Needs root and Slurm (installed with apt when missing); skipped otherwise unless STRATA_REQUIRE_SLURM=1.
"""
import calendar
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import ADMIN_TOKEN, ORIGIN_KEY, ORIGIN_SECRET, STRATA, client, free_port
from slurm import OriginGate, SlurmCluster, require_slurm
from test_claims import BUCKET, MIB, Agent, put_dataset
from test_shared_cache import Proxy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LUA = os.path.join(ROOT, "contrib", "slurm", "burst_buffer.lua")
GRACE = 6  # seconds a job whose claim failed stays held before it is cancelled (sampled by polling)


@pytest.fixture(scope="module")
def site(origin):
    require_slurm()
    s3 = client(origin, ORIGIN_KEY, ORIGIN_SECRET)
    try:
        s3.create_bucket(Bucket=BUCKET)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    slow = OriginGate()
    proxy = Proxy(origin.split("//", 1)[1], before=slow.before)
    agent = Agent(f"http://{proxy.addr}", ram="16MiB", disk="48MiB")
    for team in ("vision", "audio"):
        agent.call("POST", "/v1/teams", {"name": team})
    # The job's user is in the Unix group of team vision (the script checks it), not of audio.
    subprocess.run(["groupadd", "-f", "vision"], check=True)
    subprocess.run(["groupadd", "-f", "audio"], check=True)
    subprocess.run(["usermod", "-aG", "vision", "nobody"], check=True)
    state = tempfile.mkdtemp(prefix="strata-slurm-state-")
    token_file = os.path.join(state, "token")
    with open(token_file, "w") as f:
        f.write(ADMIN_TOKEN + "\n")
    os.chmod(token_file, 0o600)
    claims = tempfile.mkdtemp(prefix="strata-claims-")
    os.chmod(claims, 0o755)
    cluster = SlurmCluster(LUA, bb_conf="StageInTimeout=120\n", env={
        "STRATA_BIN": STRATA, "STRATA_API": agent.api, "STRATA_TOKEN_FILE": token_file,
        "STRATA_STATE_DIR": os.path.join(state, "jobs"), "STRATA_FAIL_GRACE_SECS": str(GRACE),
        "STRATA_WAIT_SECS": "100"})
    yield {"agent": agent, "slurm": cluster, "s3": s3, "slow": slow, "claims": claims, "state": state}
    cluster.close()
    agent.close()
    proxy.close()
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(claims, ignore_errors=True)


def claim_file(site, name, text):
    p = os.path.join(site["claims"], name)
    with open(p, "w") as f:
        f.write(text)
    os.chmod(p, 0o644)
    return p


def reader_script(directive, keys, extra=""):
    """A batch script that prints its STRATA_* environment and the SHA-256 of every key read through the agent."""
    return f"""#!/bin/bash
{directive}
{extra}
env | grep '^STRATA_' | sort | sed 's/^/ENV /'
python3 - <<'PY'
import hashlib, json, os, urllib.parse, urllib.request
api, job = os.environ["STRATA_AGENT"], os.environ["STRATA_JOB"]
for key in {json.dumps(sorted(keys))}:
    loc = os.environ["STRATA_DATASET_TRAIN"] + key.split("/", 1)[1]
    req = urllib.request.Request(api + "/v1/read?location=" + urllib.parse.quote(loc, safe=""),
                                 headers={{"Authorization": "Bearer " + os.environ["STRATA_TOKEN"],
                                           "x-strata-job": job}})
    print("READ", json.dumps(key), hashlib.sha256(urllib.request.urlopen(req).read()).hexdigest())
PY
"""


def reads_of(out):
    """{key: sha256} from a reader script's READ lines."""
    return dict((json.loads(k), v) for k, v in (line[5:].rsplit(" ", 1) for line in out.splitlines()
                                                if line.startswith("READ ")))


def job_claim(site, job_id, released=True, timeout=30):
    """The claim of a Slurm job, once (by default) released."""
    deadline = time.time() + timeout
    while True:
        cs = site["agent"].ok("GET", f"/v1/claims?job={job_id}&released=true")
        if cs and (not released or cs[0]["state"] == "released"):
            assert len(cs) == 1, cs
            return cs[0]
        assert time.time() < deadline, f"no {'released ' if released else ''}claim for job {job_id}: {cs}"
        time.sleep(0.2)


def quotas(site):
    return {q["scope"]: q for q in site["agent"].ok("GET", "/v1/quotas/vision")}


def submit_env():
    return ("--export=ALL,STRATA_TOKEN=" + ADMIN_TOKEN,)


def test_a_job_starts_only_when_its_data_is_staged_reads_it_all_and_is_accounted(site):
    objs = put_dataset(site["s3"], "slurm-ds/", [3 * MIB + 1, MIB, 17, 2 * MIB])
    f = claim_file(site, "train.yaml", """version: 1
team: vision
datasets:
  - {name: train, location: origin/slurm-ds/}
scratch: {size: 8MiB, ttl_secs: 3600}
""")
    agent, slurm = site["agent"], site["slurm"]
    j = slurm.sbatch(reader_script(f"#BB_LUA strata claim={f}", objs), extra_args=submit_env())
    d = slurm.wait(j, "COMPLETED", timeout=120)
    out = slurm.output(j)
    env = dict(line[4:].split("=", 1) for line in out.splitlines() if line.startswith("ENV "))
    reads = reads_of(out)
    assert reads == objs, out
    c = job_claim(site, j)
    assert env["STRATA_CLAIM"] == c["id"] and env["STRATA_JOB"] == str(j) and env["STRATA_AGENT"] == agent.api
    assert env["STRATA_DATASET_TRAIN"] == "origin/slurm-ds/" and env["STRATA_SCRATCH"].endswith(
        os.path.basename(env["STRATA_SCRATCH"])), env
    assert c["reason"] == f"slurm job {j} ended", c
    # The job started after its claim was ready (StartTime is local time, whole seconds).
    start = time.mktime(time.strptime(d["StartTime"], "%Y-%m-%dT%H:%M:%S"))
    assert c["ready_at"] <= start + 1, (c["ready_at"], d["StartTime"])
    total = sum(s for s in [3 * MIB + 1, MIB, 17, 2 * MIB])
    u = c["usage"]
    assert u["staged_bytes"] == total and u["origin_bytes"] == total, ("the job's reads took nothing from the "
                                                                      "origin", u)
    assert d["AdminComment"].startswith('strata:{"claim":"' + c["id"] + '"'), d["AdminComment"]
    assert json.loads(d["AdminComment"][len("strata:"):])["usage"]["staged_bytes"] == total
    q = quotas(site)
    assert q["scratch"]["used_bytes"] == 0, q["scratch"]
    assert agent.ok("GET", "/v1/protections") == []


def test_a_jobs_mount_is_there_when_it_starts_is_read_byte_exact_and_goes_with_the_job(site):
    if not os.path.exists("/dev/fuse"):
        if os.environ.get("STRATA_REQUIRE_FUSE") == "1":
            pytest.fail("STRATA_REQUIRE_FUSE=1 but /dev/fuse is missing")
        pytest.skip("no /dev/fuse")
    objs = put_dataset(site["s3"], "slurm-mnt/", [3 * MIB + 1, MIB, 17, 0, 2 * MIB])
    mnt = os.path.join(site["claims"], "mnt-job", "train")
    f = claim_file(site, "mounted.yaml", f"""version: 1
team: vision
datasets:
  - {{name: train, location: origin/slurm-mnt/, mount: {mnt}}}
""")
    # The job (user nobody, group vision) reads every file through the mount with plain file I/O.
    script = f"""#!/bin/bash
#BB_LUA strata claim={f}
echo "MOUNT $STRATA_MOUNT_TRAIN"
echo "FILES $(find "$STRATA_MOUNT_TRAIN" -type f | wc -l)"
cd "$STRATA_MOUNT_TRAIN" && find . -type f | sort | while read -r p; do
  echo "READ $(printf '%s' "slurm-mnt/${{p#./}}" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))') $(sha256sum "$p" | cut -d' ' -f1)"
done
"""
    slurm = site["slurm"]
    j = slurm.sbatch(script, extra_args=submit_env())
    slurm.wait(j, "COMPLETED", timeout=120)
    out = slurm.output(j)
    assert f"MOUNT {mnt}" in out, out
    assert f"FILES {len(objs)}" in out, out
    assert reads_of(out) == objs, out
    c = job_claim(site, j)
    assert c["reason"] == f"slurm job {j} ended", c
    with open("/proc/mounts") as m:
        assert not any(line.split()[1] == mnt for line in m), "the job's mount outlived its claim"
    assert os.listdir(mnt) == []


def test_an_inline_claim(site):
    objs = put_dataset(site["s3"], "slurm-inline/", [MIB, 5])
    script = reader_script("#BB_LUA strata\n#STRATA version: 1\n#STRATA team: vision\n#STRATA datasets:\n"
                           "#STRATA   - {name: train, location: origin/slurm-inline/, mode: pin}", objs)
    j = site["slurm"].sbatch(script, extra_args=submit_env())
    site["slurm"].wait(j, "COMPLETED", timeout=120)
    reads = reads_of(site["slurm"].output(j))
    assert reads == objs
    c = job_claim(site, j)
    assert c["datasets"][0]["mode"] == "pin"
    assert not any(p["prefix"] == "slurm-inline/" for p in site["agent"].cache()["pins"]), "unpinned at the end"
    assert quotas(site)["cache"]["used_bytes"] == 0


def test_scancel_during_staging_and_during_the_run_releases_everything(site):
    put_dataset(site["s3"], "slurm-slow/", [MIB] * 24)
    f = claim_file(site, "slow.yaml", """version: 1
team: vision
ttl_secs: 30
datasets:
  - {name: train, location: origin/slurm-slow/, mode: pin}
scratch: {size: 4MiB, ttl_secs: 3600}
""")
    agent, slurm = site["agent"], site["slurm"]
    site["slow"].hold()  # staging stays at its first GETs until released
    try:
        j = slurm.sbatch(f"#!/bin/bash\n#BB_LUA strata claim={f}\necho never\n", extra_args=submit_env())
        c = job_claim(site, j, released=False, timeout=60)
        deadline = time.time() + 30
        while agent.ok("GET", f"/v1/claims/{c['id']}")["state"] != "staging":
            assert time.time() < deadline
            time.sleep(0.1)
        # data_in sets the Comment after the claim was submitted (staging may start first): waited for.
        d = slurm.wait(j, "PENDING", timeout=30, pred=lambda d: (d.get("Comment") or "").startswith("strata:"))
        assert d["JobState"] == "PENDING", d
        slurm.scancel(j)
        slurm.wait(j, "CANCELLED", timeout=30)
    finally:
        site["slow"].release()
    # Teardown releases it; in 22.05 a kill of data_in sometimes kills the teardown too, and then the TTL does.
    c = job_claim(site, j, timeout=60)
    assert c["reason"] in (f"slurm job {j} cancelled", "no heartbeat for 30 s (the claim's TTL)"), c
    assert "never" not in slurm.output(j)
    q = quotas(site)
    assert q["cache"]["used_bytes"] == 0 and q["scratch"]["used_bytes"] == 0, q
    assert not any(p["prefix"] == "slurm-slow/" for p in agent.cache()["pins"])

    # and while the job runs
    j = slurm.sbatch(f"#!/bin/bash\n#BB_LUA strata claim={f}\necho started; sleep 300\n", extra_args=submit_env())
    slurm.wait(j, "RUNNING", timeout=120)
    assert job_claim(site, j, released=False)["state"] == "ready"
    slurm.scancel(j)
    c = job_claim(site, j, timeout=60)
    assert c["reason"] in (f"slurm job {j} cancelled", f"slurm job {j} ended"), c
    assert quotas(site)["scratch"]["used_bytes"] == 0


@pytest.mark.parametrize("case", ["empty", "quota", "group", "too-big"])
def test_a_claim_that_cannot_be_had_keeps_the_job_pending_with_the_reason_then_fails_it(site, case):
    agent, slurm, s3 = site["agent"], site["slurm"], site["s3"]
    team, location, extra = "vision", "origin/slurm-nothing-here/", ""
    if case == "quota":
        put_dataset(s3, "slurm-quota/", [MIB])
        location, extra = "origin/slurm-quota/", "scratch: {size: 1GiB, ttl_secs: 600}\n"
        agent.ok("PUT", "/v1/quotas/vision/scratch", {"hard_bytes": 100 * MIB})
    elif case == "group":
        put_dataset(s3, "slurm-group/", [MIB])
        team, location = "audio", "origin/slurm-group/"
    elif case == "too-big":
        put_dataset(s3, "slurm-big/", [8 * MIB] * 8)   # 64 MiB, the agent's disk tier holds 48
        location = "origin/slurm-big/"
    want = {"empty": "no objects under", "quota": "scratch.size", "group": "not in the Unix group of team audio",
            "too-big": "blocks not in the cache after staging"}[case]
    f = claim_file(site, f"bad-{case}.yaml", f"version: 1\nteam: {team}\ndatasets:\n"
                                            f"  - {{name: train, location: {location}}}\n{extra}")
    try:
        j = slurm.sbatch(f"#!/bin/bash\n#BB_LUA strata claim={f}\necho never\n", extra_args=submit_env())
        # held, pending, with the reason a person can act on
        d = slurm.wait(j, "PENDING", timeout=90, pred=lambda d: want in (d.get("SystemComment") or ""))
        assert d["Priority"] == "0" and want in (d["Comment"] or ""), d
        # then failed: cancelled after the grace period
        d = slurm.wait(j, "CANCELLED", timeout=GRACE + 30)
        assert want.replace(" ", "_") in d["Reason"] or want in (d["SystemComment"] or ""), d
        assert "never" not in slurm.output(j)
        if case == "too-big":
            assert job_claim(site, j)["state"] == "released"
        assert agent.ok("GET", "/v1/claims?team=vision") == [], "nothing left live"
        # Issue 44, finding 13: nothing of the refused job stays in the state dir.
        jobs = os.path.join(site["state"], "jobs")
        deadline = time.time() + 30
        while any(f.startswith(f"{j}.") for f in os.listdir(jobs)):
            assert time.time() < deadline, sorted(f for f in os.listdir(jobs) if f.startswith(f"{j}."))
            time.sleep(0.2)
    finally:
        if case == "quota":
            agent.ok("PUT", "/v1/quotas/vision/scratch", {})


def test_a_bad_claim_is_refused_at_sbatch_naming_the_field(site):
    f = claim_file(site, "typo.yaml", "version: 1\nteam: vision\ndatasets:\n"
                                      "  - {name: train, location: origin/x/, mode: stge}\n")
    r = site["slurm"].sbatch(f"#!/bin/bash\n#BB_LUA strata claim={f}\ntrue\n", check=False)
    assert r.returncode != 0 and "datasets[0].mode" in r.stderr and "stge" in r.stderr, r.stderr
    r = site["slurm"].sbatch("#!/bin/bash\n#BB_LUA strata\ntrue\n", check=False)
    assert r.returncode != 0 and "name a claim" in r.stderr, r.stderr


def test_a_claim_file_the_user_cannot_read_is_refused_without_showing_it(site):
    # The script runs as SlurmUser: naming a file only it can read must not leak the file through the error.
    secret = claim_file(site, "root-only.yaml", "root-only-secret-line: 42\n")
    os.chmod(secret, 0o600)
    r = site["slurm"].sbatch(f"#!/bin/bash\n#BB_LUA strata claim={secret}\ntrue\n", check=False)
    assert r.returncode != 0 and "not readable by every user" in r.stderr, r.stderr
    assert "root-only-secret-line" not in r.stderr, r.stderr


def test_doctor_slurm(site):
    env = dict(os.environ, SLURM_CONF=site["slurm"].conf, STRATA_API=site["agent"].api, STRATA_TOKEN=ADMIN_TOKEN,
               STRATA_BIN=STRATA)
    r = subprocess.run([STRATA, "doctor", "slurm"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    for line in ("ok   BurstBufferType = burst_buffer/lua", "ok   SchedulerType = sched/backfill", "Strata's",
                 "administrator"):
        assert line in r.stdout, r.stdout
    env["STRATA_API"] = f"http://127.0.0.1:{free_port()}"
    r = subprocess.run([STRATA, "doctor", "slurm"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "FAIL agent" in r.stdout and "start `strata serve`" in r.stdout, r.stdout


def test_doctor_slurm_reads_strata_site_lua_and_checks_what_the_script_will_use(site):
    """Issue 44, finding 13: `strata doctor slurm` reads the settings as the script does (its defaults,
    slurmctld's environment, then `strata_site.lua`), and checks the binary, the token file, the agent at the
    script's API with the script's token, and STRATA_WAIT_SECS against StageInTimeout."""
    conf_dir = os.path.dirname(site["slurm"].conf)
    site_lua = os.path.join(conf_dir, "strata_site.lua")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env["SLURM_CONF"] = site["slurm"].conf

    def doctor():
        return subprocess.run([STRATA, "doctor", "slurm"], env=env, capture_output=True, text=True, timeout=60)

    token_file = os.path.join(site["state"], "token")
    try:
        # A working site whose settings are in strata_site.lua (this command's environment names none).
        with open(site_lua, "w") as f:
            f.write(f'-- the site\nSTRATA_BIN = "{STRATA}"\nSTRATA_API = "{site["agent"].api}"\n'
                    f"STRATA_TOKEN_FILE = '{token_file}'\nSTRATA_WAIT_SECS = 100 -- below StageInTimeout\n")
        r = doctor()
        assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
        assert "strata_site.lua" in r.stdout and "administrator" in r.stdout, r.stdout
        # Each wrong setting is found, and named with where it came from.
        with open(site_lua, "w") as f:
            f.write(f'STRATA_BIN = "/nonexistent/strata"\nSTRATA_API = "http://127.0.0.1:{free_port()}"\n'
                    f'STRATA_TOKEN_FILE = "/nonexistent/token"\nSTRATA_WAIT_SECS = 500\n')
        r = doctor()
        out = r.stdout
        assert r.returncode == 1, out
        fails = [line for line in out.splitlines() if line.startswith("FAIL")]
        for want in ("/nonexistent/strata (strata_site.lua)", "/nonexistent/token (strata_site.lua)",
                     "FAIL agent http://127.0.0.1:", "STRATA_WAIT_SECS = 500 (strata_site.lua) against "
                     "StageInTimeout = 120"):
            assert any(want in line for line in fails), (want, out)
    finally:
        os.remove(site_lua)
