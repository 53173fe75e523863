"""Strata's prolog/epilog scripts for Slurm sites without burst buffers (contrib/slurm/prolog.sh,
task_prolog.sh, epilog.sh, strata-env.sh) on a real single-node Slurm 22.05 (tests/python/slurm.py), with a
`strata serve` agent in front of a real S3 server (moto) and batch jobs submitted as a user (nobody).

The scripts are installed as a site installs them: copied into one directory (the harness's slurm.conf gets
PrologSlurmctld=, EpilogSlurmctld=, TaskProlog= lines naming the copies) with a `strata-site.sh` beside them
that holds the settings (STRATA_BIN, STRATA_API, STRATA_TOKEN_FILE: a 0600 root file with the admin token,
STRATA_STATE_DIR, SLURM_CONF). The harness always configures burst_buffer/lua (lua_path=None is refused), so
it gets a Lua script whose functions all succeed; these jobs name no burst buffer.

Covered: a job with `--comment=strata:claim=FILE` stays CONFIGURING while its claim stages, starts only once
the claim is ready, finds exactly the claim's environment (STRATA_CLAIM, STRATA_DATASET_TRAIN, STRATA_AGENT,
...) and no token, the staging in its AdminComment, and its claim released at its end ("slurm job N ended");
the environment each script gets; scancel of a running job releases its claim; a job without a Strata comment
runs as usual and no claim is made; a claim that cannot be had (refused: an empty dataset; failed: larger than
the cache) requeues the job (or cancels a --no-requeue one) with the reason in its AdminComment and nothing
left live.

What was learned about Slurm 22.05.8 (checked here, except what is marked "probe": seen in one-off runs):

* PrologSlurmctld and EpilogSlurmctld run as SlurmUser (root) in slurmctld's working directory with only the
  job's variables: SLURM_JOB_ID (and SLURM_JOBID), SLURM_JOB_COMMENT, SLURM_JOB_UID/GID/USER/GROUP,
  SLURM_JOB_NODELIST, SLURM_JOB_PARTITION, SLURM_JOB_RESTART_COUNT, SLURM_JOB_WORK_DIR, SLURM_JOB_STDOUT,
  SLURM_CLUSTER_NAME, SLURM_SCRIPT_CONTEXT=prolog_slurmctld / epilog_slurmctld (the epilog also
  SLURM_JOB_EXIT_CODE, SLURM_JOB_EXIT_CODE2, SLURM_JOB_DERIVED_EC). Nothing of slurmctld's environment: no
  PATH (dash falls back to /usr/local/sbin:...:/bin), no SLURM_CONF, no STRATA_*. So the settings cannot come
  from slurmctld's environment as burst_buffer.lua's do: hence strata-site.sh.
* TaskProlog runs on slurmd as the job's user (nobody) in the job's working directory, with the job's
  environment (with --export=NONE: SLURM_* only; with the default --export=ALL: the submitter's, probe), not
  slurmd's. So it can read neither the site's 0600 token nor a 0700 state directory: prolog.sh (root, on the
  controller) saves the claim's environment in <state>/<job>.env, owned by the job's user, and
  task_prolog.sh prints it. Its `export NAME=value` lines are taken verbatim (probe: `export X='a b'` gives
  X='a b', quotes included), so `strata claim env`'s shell-quoted lines cannot be passed through.
* While PrologSlurmctld runs the job is CONFIGURING (it holds its node; StartTime is the allocation, before
  the prolog); `scontrol update ... AdminComment=` from it works. From EpilogSlurmctld it fails for a finished
  job ("Job has already finished for job N", exit 1, probe); it works on a requeued one.
* PrologSlurmctld exiting non-zero (its stdout and stderr are in no log at SlurmctldDebug=info, probe): the
  slurmctld log says "prolog_slurmctld JobId=N prolog exit status 1:0" and a batch job is requeued
  ("Requeuing JobId=N"): PENDING, Reason=BeginTime (None until the next scheduler pass), Restarts=1, not held,
  EligibleTime 120 s later, when the prolog runs again (a refused claim is retried every 2 minutes);
  EpilogSlurmctld runs first (SLURM_JOB_RESTART_COUNT already 1, probe). A --no-requeue job is CANCELLED
  ("unable to requeue JobId=N: Requested operation is presently disabled").
* When Slurm kills a job whose PrologSlurmctld is running or has just failed, it sometimes SIGKILLs the
  EpilogSlurmctld it starts for it at that moment ("slurmscriptd: _run_script: JobId=N EpilogSlurmctld
  killed by signal 9", probe): 1 of 8 --no-requeue jobs with a failing prolog (requeued ones: 8 of 8 epilogs
  ran), and a scancel during the prolog, which SIGKILLs the prolog too (no trap runs). So prolog.sh releases a
  claim that failed itself, and a claim cancelled during staging is left to its TTL (not exercised here). A
  scancel of a running job runs the epilog normally.

Needs root and Slurm (installed with apt when missing); skipped otherwise unless STRATA_REQUIRE_SLURM=1.
"""
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from conftest import ADMIN_TOKEN, ORIGIN_KEY, ORIGIN_SECRET, STRATA, client
from slurm import OriginGate, SlurmCluster, require_slurm
from test_claims import BUCKET, MIB, Agent, put_dataset
from test_shared_cache import Proxy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONTRIB = os.path.join(ROOT, "contrib", "slurm")
SCRIPTS = ("prolog.sh", "task_prolog.sh", "epilog.sh", "strata-env.sh")
# The harness always sets BurstBufferType=burst_buffer/lua; a script whose every function succeeds keeps the
# plugin quiet (a missing function is logged as an error and the plugin marked down).
NOOP_LUA = "\n".join(f"function {f}(...) return slurm.SUCCESS end" for f in (
    "slurm_bb_job_process slurm_bb_pools slurm_bb_job_teardown slurm_bb_setup slurm_bb_data_in slurm_bb_real_size "
    "slurm_bb_paths slurm_bb_pre_run slurm_bb_post_run slurm_bb_data_out").split()) + \
    '\nfunction slurm_bb_get_status(...) return slurm.SUCCESS, "" end\n'
REQUEUE_DELAY = 120  # seconds a requeued job waits (Slurm 22.05)


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
    agent.call("POST", "/v1/teams", {"name": "vision"})
    # The job's user is in the Unix group of team vision (prolog.sh checks it), not of audio.
    for g in ("vision", "audio"):
        subprocess.run(["groupadd", "-f", g], check=True)
    subprocess.run(["usermod", "-aG", "vision", "nobody"], check=True)
    base = tempfile.mkdtemp(prefix="strata-slurm-prolog-")
    cluster = None
    try:
        os.chmod(base, 0o755)  # like /var/spool: the job's user may pass through to the state directory
        # /etc/slurm/strata/: the scripts, readable and runnable by all (TaskProlog runs as the job's user)
        install = os.path.join(base, "strata")
        os.mkdir(install, 0o755)
        for name in SCRIPTS:
            shutil.copyfile(os.path.join(CONTRIB, name), os.path.join(install, name))
            os.chmod(os.path.join(install, name), 0o755)
        secrets = os.path.join(base, "etc")
        os.mkdir(secrets, 0o700)
        token_file = os.path.join(secrets, "slurm.token")
        with open(token_file, "w") as f:
            f.write(ADMIN_TOKEN + "\n")
        os.chmod(token_file, 0o600)
        state = os.path.join(base, "spool")  # prolog.sh creates it
        record = os.path.join(base, "env")   # each script's environment, recorded by the site file
        os.mkdir(record)
        os.chmod(record, 0o1777)
        claims = os.path.join(base, "claims")
        os.mkdir(claims, 0o755)
        # slurmctld's (and so, for burst_buffer.lua, the Lua's) environment: none of it reaches the scripts.
        cluster = SlurmCluster(lua_text=NOOP_LUA, extra_conf="\n".join([
            f"PrologSlurmctld={install}/prolog.sh",
            f"EpilogSlurmctld={install}/epilog.sh",
            f"TaskProlog={install}/task_prolog.sh",
        ]), env={"STRATA_BIN": STRATA, "STRATA_API": agent.api, "CTLD_ONLY": "1"})
        # Read by every script at run time, so written once slurm.conf's place is known.
        with open(os.path.join(install, "strata-site.sh"), "w") as f:
            f.write("\n".join([
                "# the test's own: what each script was given",
                f'rec="{record}/$(basename "$0").${{SLURM_JOB_ID:-none}}"',
                '{ echo "UID=$(id -u)"; echo "CWD=$(pwd)"; env; } > "$rec" 2>/dev/null || true',
                "# Strata's site settings for prolog.sh, task_prolog.sh and epilog.sh",
                f"STRATA_BIN={STRATA}",
                f"STRATA_API={agent.api}",
                f"STRATA_TOKEN_FILE={token_file}",
                f"STRATA_STATE_DIR={state}",
                f"SLURM_CONF={cluster.conf}; export SLURM_CONF",
            ]) + "\n")
        os.chmod(os.path.join(install, "strata-site.sh"), 0o644)
        yield {"agent": agent, "slurm": cluster, "s3": s3, "slow": slow, "claims": claims, "state": state,
               "record": record}
    finally:
        if cluster is not None:
            cluster.close()
        agent.close()
        proxy.close()
        shutil.rmtree(base, ignore_errors=True)


def claim_file(site, name, text):
    p = os.path.join(site["claims"], name)
    with open(p, "w") as f:
        f.write(text)
    os.chmod(p, 0o644)
    return p


def claims_of(site, job_id):
    return site["agent"].ok("GET", f"/v1/claims?job={job_id}&released=true")


def job_claim(site, job_id, released=True, timeout=30):
    """The claim of a Slurm job, once (by default) released."""
    deadline = time.time() + timeout
    while True:
        cs = claims_of(site, job_id)
        if cs and (not released or cs[0]["state"] == "released"):
            assert len(cs) == 1, cs
            return cs[0]
        assert time.time() < deadline, f"no {'released ' if released else ''}claim for job {job_id}: {cs}"
        time.sleep(0.2)


def recorded(site, script, job_id):
    """The environment (plus UID and CWD) `script` ran with for the job, as the site file recorded it."""
    with open(os.path.join(site["record"], f"{script}.{job_id}")) as f:
        return dict(line.split("=", 1) for line in f.read().splitlines() if "=" in line)


def no_state_files(site, job_id, timeout=30):
    """Waits until the job's state files are gone (the epilog removes them after it releases the claim, so a
    released claim may be seen first); fails with what is left."""
    deadline = time.time() + timeout
    while state_files(site, job_id) and time.time() < deadline:
        time.sleep(0.2)
    assert state_files(site, job_id) == [], state_files(site, job_id)


def state_files(site, job_id):
    try:
        return sorted(n for n in os.listdir(site["state"]) if n.split(".")[0] == str(job_id))
    except FileNotFoundError:
        return []


# --export=NONE: the job's environment is Slurm's and TaskProlog's only, nothing of the submitter's.
CLEAN = ("--export=NONE",)


def test_a_job_runs_once_its_claim_is_ready_with_its_environment_and_the_claim_is_released(site):
    agent, slurm = site["agent"], site["slurm"]
    sizes = [MIB, 2 * MIB + 3, 17]
    put_dataset(site["s3"], "prolog-ds/", sizes)
    f = claim_file(site, "train.yaml", """version: 1
team: vision
ttl_secs: 600
datasets:
  - {name: train, location: origin/prolog-ds/}
scratch: {size: 4MiB, ttl_secs: 600}
""")
    script = f"""#!/bin/bash
echo "START $(date +%s.%N)"
env | grep '^STRATA_' | sort | sed 's/^/ENV /'
ls {site['state']} >/dev/null 2>&1; echo "LIST $?"
"""
    site["slow"].hold()  # staging stays at its first GETs until released
    try:
        j = slurm.sbatch(script, extra_args=(f"--comment=strata:claim={f}", *CLEAN))
        c = job_claim(site, j, released=False, timeout=60)
        deadline = time.time() + 30
        while agent.ok("GET", f"/v1/claims/{c['id']}")["state"] != "staging":  # its object GETs are held
            assert time.time() < deadline
            time.sleep(0.05)
        # staging: the job has its node but its script has not started
        d = slurm.job(j)
        assert d["JobState"] == "CONFIGURING", d
        assert "START" not in slurm.output(j)
    finally:
        site["slow"].release()
    d = slurm.wait(j, "COMPLETED", timeout=120)
    out = slurm.output(j)
    env = dict(line[4:].split("=", 1) for line in out.splitlines() if line.startswith("ENV "))
    start = float(next(line.split()[1] for line in out.splitlines() if line.startswith("START ")))
    c = job_claim(site, j)
    assert c["state"] == "released" and c["reason"] == f"slurm job {j} ended", c
    assert c["ready_at"] <= start, ("the job started before its claim was ready", c["ready_at"], start)
    # exactly the claim's environment, nothing quoted, no token
    assert env == c["env"], (env, c["env"])
    assert env["STRATA_CLAIM"] == c["id"] and env["STRATA_JOB"] == str(j) and env["STRATA_TEAM"] == "vision"
    assert env["STRATA_DATASET_TRAIN"] == "origin/prolog-ds/" and env["STRATA_AGENT"] == agent.api, env
    assert "LIST 0" not in out, "the job's user lists nothing in the state directory"
    # the staging, recorded before the job ran
    assert d["AdminComment"].startswith('strata:{"claim":"' + c["id"] + '"'), d["AdminComment"]
    assert json.loads(d["AdminComment"][len("strata:"):])["usage"]["staged_bytes"] == sum(sizes)
    assert c["usage"]["staged_bytes"] == sum(sizes), c["usage"]
    no_state_files(site, j)  # the epilog removed what the prolog kept
    assert agent.ok("GET", "/v1/claims?team=vision") == [] and agent.ok("GET", "/v1/protections") == []
    q = {q["scope"]: q for q in agent.ok("GET", "/v1/quotas/vision")}
    assert q["scratch"]["used_bytes"] == 0, q

    # What each script was given (see the module's docstring).
    pro, epi, task = (recorded(site, s, j) for s in ("prolog.sh", "epilog.sh", "task_prolog.sh"))
    for e, ctx in ((pro, "prolog_slurmctld"), (epi, "epilog_slurmctld")):
        assert e["UID"] == "0" and e["SLURM_SCRIPT_CONTEXT"] == ctx, e
        assert e["SLURM_JOB_ID"] == str(j) and e["SLURM_JOB_COMMENT"] == f"strata:claim={f}", e
        assert e["SLURM_JOB_UID"] == "65534" and e["SLURM_JOB_USER"] == "nobody", e
        assert e["CWD"] == slurm.dir, e
        assert not {"CTLD_ONLY", "STRATA_API", "STRATA_BIN", "STRATA_TOKEN", "PATH", "SLURM_CONF"} & set(e), \
            sorted(e)
    assert epi["SLURM_JOB_EXIT_CODE"] == "0", epi
    assert task["UID"] == "65534" and task["SLURM_SCRIPT_CONTEXT"] == "prolog_task", task
    assert task["SLURM_JOB_ID"] == str(j) and task["CWD"] == slurm.jobs_dir, task
    # the job's environment (nothing exported), not slurmd's (which has the test's STRATA_TOKEN)
    assert not {"CTLD_ONLY", "STRATA_TOKEN", "STRATA_BIN", "STRATA_CLAIM"} & set(task), sorted(task)


def test_scancel_of_a_running_job_releases_its_claim(site):
    agent, slurm = site["agent"], site["slurm"]
    put_dataset(site["s3"], "prolog-cancel/", [MIB])
    f = claim_file(site, "cancel.yaml", "version: 1\nteam: vision\nttl_secs: 600\ndatasets:\n"
                                        "  - {name: train, location: origin/prolog-cancel/, mode: pin}\n")
    j = slurm.sbatch("#!/bin/bash\necho started\nsleep 300\n", extra_args=(f"--comment=strata:claim={f}", *CLEAN))
    slurm.wait(j, "RUNNING", timeout=60, pred=lambda d: "started" in slurm.output(j))
    assert job_claim(site, j, released=False)["state"] == "ready"
    assert any(p["prefix"] == "prolog-cancel/" for p in agent.cache()["pins"])
    slurm.scancel(j)
    slurm.wait(j, "CANCELLED", timeout=30)
    c = job_claim(site, j)
    assert c["reason"] == f"slurm job {j} ended", c
    assert not any(p["prefix"] == "prolog-cancel/" for p in agent.cache()["pins"]), "unpinned"
    no_state_files(site, j)


def test_a_job_without_a_strata_comment_runs_as_usual_and_makes_no_claim(site):
    slurm = site["slurm"]
    script = "#!/bin/bash\necho ran\nenv | grep '^STRATA_' | sed 's/^/ENV /'\n"
    plain = slurm.sbatch(script, extra_args=CLEAN)
    noted = slurm.sbatch(script, extra_args=("--comment=nightly run, strata:claims later", *CLEAN))
    for j in (plain, noted):
        d = slurm.wait(j, "COMPLETED", timeout=60)
        out = slurm.output(j)
        assert "ran" in out and "ENV " not in out, out
        assert d["AdminComment"] is None, d
        assert claims_of(site, j) == []
        no_state_files(site, j)
        assert recorded(site, "prolog.sh", j)["SLURM_JOB_ID"] == str(j), "the prolog ran (and let it be)"


@pytest.mark.parametrize("case", ["empty", "group", "unreadable", "too-big"])
def test_a_claim_that_cannot_be_had_requeues_the_job_with_the_reason_and_leaves_nothing_live(site, case):
    agent, slurm = site["agent"], site["slurm"]
    team = "vision"
    if case == "empty":  # refused at admission: no claim is made
        location, want = "origin/prolog-nothing-here/", "no objects under"
    elif case == "group":  # the user is not in team audio's group: nothing is submitted
        put_dataset(site["s3"], "prolog-group/", [MIB])
        location, want, team = "origin/prolog-group/", "not in the Unix group of team audio", "audio"
    elif case == "unreadable":  # a file only SlurmUser can read: refused, its contents shown nowhere
        location, want = "origin/prolog-nothing-here/", "cannot read the claim file"
    else:  # admitted, then failed while staging: 64 MiB, the agent's disk tier holds 48
        put_dataset(site["s3"], "prolog-big/", [8 * MIB] * 8)
        location, want = "origin/prolog-big/", "blocks not in the cache after staging"
    f = claim_file(site, f"bad-{case}.yaml", f"version: 1\nteam: {team}\ndatasets:\n"
                                            f"  - {{name: train, location: {location}}}\n")
    if case == "unreadable":
        os.chmod(f, 0o600)
    script = "#!/bin/bash\necho never\n"
    requeued = slurm.sbatch(script, extra_args=(f"--comment=strata:claim={f}", *CLEAN))
    once = slurm.sbatch(script, extra_args=(f"--comment=strata:claim={f}", "--no-requeue", *CLEAN))
    try:
        # A batch job is requeued: pending, eligible again in 2 minutes (then the prolog runs again).
        # (Reason is None until the scheduler's next pass, about a second later.)
        d = slurm.wait(requeued, "PENDING", timeout=90,
                       pred=lambda d: d["Restarts"] == "1" and d["Reason"] == "BeginTime")
        eligible = time.mktime(time.strptime(d["EligibleTime"], "%Y-%m-%dT%H:%M:%S"))
        assert REQUEUE_DELAY - 30 < eligible - time.time() <= REQUEUE_DELAY + 1, (d["EligibleTime"], time.time())
        assert want in (d["AdminComment"] or "") and d["AdminComment"].startswith("strata: "), d
        assert d["Priority"] != "0", "requeued, not held"
        # A --no-requeue job is cancelled.
        d = slurm.wait(once, "CANCELLED", timeout=90)
        assert want in (d["AdminComment"] or ""), d
        slurm.wait_log(rf"prolog_slurmctld JobId={requeued} prolog exit status 1:0")
        slurm.wait_log(rf"Requeuing JobId={requeued}")
        slurm.wait_log(rf"unable to requeue JobId={once}: Requested operation is presently disabled")
        for j in (requeued, once):
            assert "never" not in slurm.output(j)
            if case != "too-big":
                assert claims_of(site, j) == [], "refused: nothing was made"
            else:  # the failed claim, released by the prolog (the epilog Slurm runs after it may be killed)
                c = job_claim(site, j)
                assert c["reason"] == f"slurm job {j} not started: its claim failed", c
                assert c.get("ready_at") is None, c
            no_state_files(site, j)
        assert agent.ok("GET", "/v1/claims?team=vision") == [], "nothing left live"
        assert agent.ok("GET", "/v1/protections") == []
    finally:
        slurm.scancel(requeued)
    slurm.wait(requeued, "CANCELLED", timeout=30)
