"""The Slurm harness (tests/python/slurm.py) on a real single-node cluster, with a trivial burst_buffer.lua.

What it pins down about Slurm 22.05's burst_buffer/lua (the harness's docstring has the details): a `#BB_LUA`
job runs every stage in order; a variable written to the paths file reaches the job's environment; a failing
data_in leaves the job PENDING and held (Priority=0) with the message in Reason and SystemComment; data_in
runs as SlurmUser in a forked process that may call `scontrol update` (Comment/AdminComment show progress
while the job waits with Reason=BurstBufferStageIn); StageInTimeout kills it; scancel runs teardown with
hurry=true; a refusal in job_process fails sbatch with its message.

Needs root and Slurm (installed with apt when missing); skipped otherwise unless STRATA_REQUIRE_SLURM=1.
"""
import os
import re
import shutil
import socket
import tempfile
import time

import pytest

from slurm import SlurmCluster, parse_scontrol, require_slurm

STAGE_IN_TIMEOUT = 6

# Every slurm_bb_* function 22.05 calls, each recording its arguments (one line, fields split by " | ") in
# $BB_TEST_LOG. The job script's `# MODE=...` line picks a behaviour.
LUA = r'''
local LOG = os.getenv("BB_TEST_LOG")

local function rec(...)
  local t = {}
  for i = 1, select("#", ...) do t[i] = tostring((select(i, ...))) end
  local f = io.open(LOG, "a")
  f:write(table.concat(t, " | "):gsub("\n", "\\n"), "\n")
  f:close()
end

-- A shell command's output and exit status (Lua 5.1's pclose gives no status: echo it).
local function run(cmd)
  local p = io.popen(cmd .. " 2>&1; echo __rc=$?")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$")) or -1
  return rc, (out:gsub("__rc=%d+%s*$", ""):gsub("%s+$", ""))
end

local function mode(job_script)
  local f = io.open(job_script)
  local s = f:read("*a")
  f:close()
  return s:match("# MODE=(%w+)") or "plain"
end

function slurm_bb_job_process(job_script, ...)
  rec("job_process", job_script, select("#", ...))
  if mode(job_script) == "reject" then
    return slurm.ERROR, "bad claim: team is missing"
  end
  return slurm.SUCCESS
end

function slurm_bb_pools()
  return slurm.SUCCESS
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
  local _, who = run("id -un")
  local _, cwd = run("pwd")
  rec("setup", job_id, uid, gid, pool, bb_size, mode(job_script), who, cwd, os.getenv("SLURM_CONF"),
      os.getenv("BB_TEST_SITE"))
  return slurm.SUCCESS
end

function slurm_bb_data_in(job_id, job_script)
  local m = mode(job_script)
  rec("data_in", job_id, m)
  if m == "fail" then
    return slurm.ERROR, "staging failed: dataset x missing"
  elseif m == "slow" then
    for i = 1, 3 do
      local rc = run("scontrol update jobid=" .. job_id .. " Comment=staging-" .. i .. "/3")
      local rc2 = run("scontrol update jobid=" .. job_id .. " AdminComment=admin-" .. i)
      rec("progress", job_id, i, rc, rc2)
      os.execute("sleep 1")
    end
  elseif m == "hang" then
    local rc = run("sleep 600")
    rec("hang-returned", job_id, rc)
    if rc ~= 0 then
      return slurm.ERROR, "sleep exited " .. rc
    end
  end
  return slurm.SUCCESS
end

function slurm_bb_real_size(job_id)
  rec("real_size", job_id)
  return slurm.SUCCESS
end

function slurm_bb_paths(job_id, job_script, path_file)
  rec("paths", job_id, path_file)
  local f = io.open(path_file, "a")
  f:write("BB_TEST_VAR=hello from paths\n")
  f:write("BB_TEST_JOB=" .. job_id .. "\n")
  f:close()
  return slurm.SUCCESS
end

function slurm_bb_pre_run(job_id, job_script)
  local rc, out = run("scontrol update jobid=" .. job_id .. " AdminComment=at-pre_run")
  rec("pre_run", job_id, rc, out)
  return slurm.SUCCESS
end

function slurm_bb_post_run(job_id, job_script)
  local rc, out = run("scontrol update jobid=" .. job_id .. " AdminComment=at-post_run")
  rec("post_run", job_id, rc, out)
  return slurm.SUCCESS
end

function slurm_bb_data_out(job_id, job_script)
  local rc, out = run("scontrol update jobid=" .. job_id .. " AdminComment=at-data_out")
  rec("data_out", job_id, rc, out)
  return slurm.SUCCESS
end

function slurm_bb_job_teardown(job_id, job_script, hurry)
  local rc, out = run("scontrol update jobid=" .. job_id .. " AdminComment=torn-down")
  rec("teardown", job_id, hurry, rc, out)
  return slurm.SUCCESS
end

function slurm_bb_get_status(...)
  return slurm.SUCCESS, "bb status ok\n"
end
'''


def script(mode="plain", body="env | sort"):
    return f"#!/bin/bash\n#BB_LUA\n# MODE={mode}\n{body}\n"


@pytest.fixture(scope="module")
def cluster():
    require_slurm()
    logdir = tempfile.mkdtemp(prefix="strata-bbtest-")
    log = os.path.join(logdir, "calls.log")
    c = SlurmCluster(lua_text=LUA, bb_conf=f"StageInTimeout={STAGE_IN_TIMEOUT}",
                     env={"BB_TEST_LOG": log, "BB_TEST_SITE": "site-value"})
    c.calls_log = log
    yield c
    c.close()
    shutil.rmtree(logdir, ignore_errors=True)


def calls(c, job_id=None):
    """The recorded calls: lists of fields, for one job (its id is the 2nd field) or all."""
    try:
        with open(c.calls_log) as f:
            rows = [l.rstrip("\n").split(" | ") for l in f]
    except FileNotFoundError:
        return []
    if job_id is None:
        return rows
    return [r for r in rows if len(r) > 1 and r[1] == str(job_id)]


def wait_call(c, job_id, name, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        hits = [r for r in calls(c, job_id) if r[0] == name]
        if hits:
            return hits[-1]
        time.sleep(0.1)
    raise AssertionError(f"{name} not called for job {job_id}: {calls(c, job_id)}\n{c.logs(40)}")


def scancel_and_teardown(c, job_id):
    """scancel a pending job whose stage-in began; returns its teardown call and whether Slurm killed the
    first one. scancel of such a job queues teardown(hurry=true), but 22.05 races: the kill of the job's
    scripts can hit the teardown just started ("teardown for JobId=N terminated by slurmctld"); the job's
    BurstBufferState then stays `teardown`, and teardown runs again (hurry=false) only when slurmctld
    restarts."""
    c.scancel(job_id)
    c.wait(job_id, "CANCELLED", 10)
    killed_msg = "teardown for JobId=%d terminated by slurmctld" % job_id
    deadline = time.time() + 15
    while time.time() < deadline:
        td = [r for r in calls(c, job_id) if r[0] == "teardown"]
        if td:
            c.wait(job_id, "CANCELLED", 10, pred=lambda d: d["BurstBufferState"] == "complete")
            return td[0], False
        if killed_msg in c.log_text():
            break
        time.sleep(0.1)
    assert killed_msg in c.log_text(), c.logs(40)
    time.sleep(1)
    assert c.job(job_id)["BurstBufferState"] == "teardown"
    c.restart_slurmctld()
    td = wait_call(c, job_id, "teardown", 20)
    c.wait(job_id, "CANCELLED", 10, pred=lambda d: d["BurstBufferState"] == "complete")
    return td, True


def test_parse_scontrol_keeps_free_text():
    line = ("JobId=7 JobName=a b UserId=nobody(65534) JobState=PENDING Reason=burst_buffer/lua:_x Dependency=(null) "
            "Comment=staging 2/3 Key=v done Priority=0 BurstBuffer=#BB_LUA pool=p capacity=1 BurstBufferState=pending")
    d = parse_scontrol(line)
    assert d["JobName"] == "a b"
    assert d["Comment"] == "staging 2/3 Key=v done"
    assert d["Priority"] == "0"
    assert d["BurstBuffer"] == "#BB_LUA pool=p capacity=1"
    assert d["BurstBufferState"] == "pending"


def test_restart_after_close():
    """A cluster starts, runs a job, stops without leftovers, and a second one starts after it."""
    require_slurm()
    dirs = []
    for i in range(2):
        with SlurmCluster(lua_text=LUA, env={"BB_TEST_LOG": "/dev/null"}) as c:
            dirs.append(c.dir)
            ports = (c.ctld_port, c.slurmd_port)
            j = c.sbatch("#!/bin/bash\necho plain job\n")  # no #BB_LUA: no burst buffer
            c.wait(j, "COMPLETED", 30)
            assert c.output(j) == "plain job\n"
            if i == 0:
                c.restart_slurmctld()  # the controller's state survives it (about 4 s: slurmd re-registers)
                assert c.job(j)["JobState"] == "COMPLETED"
                j2 = c.sbatch("#!/bin/bash\necho second\n")
                assert j2 == j + 1
                c.wait(j2, "COMPLETED", 30)
            pids = [p.pid for p in c.procs.values()]
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}")
        for port in ports:  # nothing listens there any more
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
        assert not os.path.exists(dirs[-1])
    assert dirs[0] != dirs[1]


def test_bb_job_runs_every_stage_and_paths_reach_env(cluster):
    t0 = time.time()
    j = cluster.sbatch(script())
    d = cluster.wait(j, "COMPLETED", 60)
    elapsed = time.time() - t0
    assert d["ExitCode"] == "0:0" and d["BurstBuffer"] == "#BB_LUA"
    out = cluster.output(j)
    assert "BB_TEST_VAR=hello from paths\n" in out
    assert f"BB_TEST_JOB={j}\n" in out
    wait_call(cluster, j, "teardown")
    names = [r[0] for r in calls(cluster, j)]
    # No pool/capacity requested: real_size is not called.
    assert names == ["setup", "data_in", "paths", "pre_run", "post_run", "data_out", "teardown"], names
    setup = wait_call(cluster, j, "setup")
    # uid, gid of the job's user (nobody); pool (null), size 0; the Lua runs as SlurmUser (root here), in
    # slurmctld's working directory, with slurmctld's environment.
    assert setup[2:6] == ["65534", "65534", "(null)", "0"]
    assert setup[7] == "root" and setup[8] == cluster.dir
    assert setup[9] == cluster.conf and setup[10] == "site-value"
    # job_process gets only the job script's path in 22.05 (no uid/gid/job_info yet).
    jp = [r for r in calls(cluster) if r[0] == "job_process"]
    assert jp and re.match(r".*/state/hash\.\d/job\.\d+/script$", jp[-1][1]) and jp[-1][2] == "0"
    teardown = wait_call(cluster, j, "teardown")
    assert teardown[2] == "false"
    # `scontrol update` works from pre_run (the job is CONFIGURING), not from post_run, data_out or teardown:
    # the job is in STAGE_OUT or done by then, and Slurm answers "Job has already finished".
    assert wait_call(cluster, j, "pre_run")[2:] == ["0", ""]
    for stage in ("post_run", "data_out", "teardown"):
        r = wait_call(cluster, j, stage)
        assert r[-2:] == ["1", f"Job has already finished for job {j}"], r
    assert cluster.job(j)["AdminComment"] == "at-pre_run"
    # `scontrol show bbstat ARGS...` prints what slurm_bb_get_status returns.
    assert cluster.run("scontrol", "show", "bbstat", "a").stdout == "bb status ok\n"
    assert elapsed < 20, elapsed


def test_job_process_error_refuses_submission(cluster):
    r = cluster.sbatch(script("reject"), check=False)
    assert not isinstance(r, int)
    assert r.returncode == 1
    assert "sbatch: error: burst_buffer/lua: bad claim: team is missing" in r.stderr
    assert "Burst Buffer request invalid" in r.stderr


def test_data_in_error_holds_job_until_scancel(cluster):
    j = cluster.sbatch(script("fail"))
    d = cluster.wait(j, "PENDING", 30, pred=lambda d: d["Priority"] == "0")
    # Whitespace in Reason is replaced by underscores; SystemComment keeps the message as returned.
    assert d["Reason"] == "burst_buffer/lua:_slurm_bb_data_in:_staging_failed:_dataset_x_missing", d
    assert re.fullmatch(r"\S+ \S+ burst_buffer/lua: data_in: staging failed: dataset x missing",
                        d["SystemComment"]), d
    assert d["BurstBufferState"] == "staging-in"
    time.sleep(2)  # it stays that way: held, not retried, never run, no teardown
    d = cluster.job(j)
    assert (d["JobState"], d["Priority"]) == ("PENDING", "0")
    assert [r[0] for r in calls(cluster, j)] == ["setup", "data_in"]
    assert not os.path.exists(d["StdOut"])
    assert "error: slurm_bb_data_in for JobId=%d failed." % j in cluster.log_text()
    td, killed = scancel_and_teardown(cluster, j)
    assert td[2] == ("false" if killed else "true")  # hurry
    assert cluster.job(j)["Reason"].startswith("burst_buffer/lua:_slurm_bb_data_in")  # the reason stays


def test_slow_data_in_shows_progress_in_comment(cluster):
    j = cluster.sbatch(script("slow"))
    seen = set()
    deadline = time.time() + 30
    while time.time() < deadline:
        d = cluster.job(j)
        seen.add((d["JobState"], d["Reason"], d["Comment"], d["AdminComment"]))
        if d["JobState"] == "COMPLETED":
            break
        time.sleep(0.2)
    pending = {s for s in seen if s[0] == "PENDING"}
    assert any(s[1] == "BurstBufferStageIn" for s in pending), seen
    assert {s[2] for s in pending} >= {"staging-1/3", "staging-2/3", "staging-3/3"}, seen
    assert any(s[3] == "admin-2" for s in pending), seen
    progress = [r for r in calls(cluster, j) if r[0] == "progress"]
    assert [r[3:] for r in progress] == [["0", "0"]] * 3  # scontrol update from data_in: no deadlock
    assert cluster.job(j)["Comment"] == "staging-3/3"
    assert "BB_TEST_VAR=hello from paths" in cluster.output(j)


def test_data_in_past_stage_in_timeout_is_killed(cluster):
    t0 = time.time()
    j = cluster.sbatch(script("hang"))
    cluster.wait(j, "PENDING", 15, pred=lambda d: d["Reason"] == "BurstBufferStageIn")
    d = cluster.wait(j, "PENDING", STAGE_IN_TIMEOUT + 20, pred=lambda d: d["Priority"] == "0")
    took = time.time() - t0
    assert d["Reason"] == f"burst_buffer/lua:_slurm_bb_data_in:_Timeout_@_{STAGE_IN_TIMEOUT * 1000}_msec", d
    assert STAGE_IN_TIMEOUT <= took < STAGE_IN_TIMEOUT + 10, took
    # The process group got SIGTERM, then SIGKILL 10 ms later; whatever the Lua returns in between is not
    # what Reason shows (the response pipe is not read after a timeout).
    hr = [r for r in calls(cluster, j) if r[0] == "hang-returned"]
    assert all(r[2] != "0" for r in hr), hr
    td, killed = scancel_and_teardown(cluster, j)
    assert td[2] == ("false" if killed else "true")


def test_scancel_during_data_in_runs_teardown(cluster):
    """scancel kills data_in and queues teardown(hurry=true) (see scancel_and_teardown for 22.05's race)."""
    j = cluster.sbatch(script("hang"))
    cluster.wait(j, "PENDING", 15, pred=lambda d: d["Reason"] == "BurstBufferStageIn")
    t0 = time.time()
    td, killed = scancel_and_teardown(cluster, j)
    assert cluster.wait_log(r"data_in for JobId=%d terminated by slurmctld" % j, 10)
    if not killed:
        assert td[2] == "true"
        assert time.time() - t0 < 20  # soon, not after the 600 s the hung data_in would take
    assert not os.path.exists(cluster.job(j)["StdOut"])
