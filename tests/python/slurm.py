"""A real single-node Slurm cluster for tests (Debian 12's Slurm 22.05.8), with the burst_buffer/lua plugin.

Usage (needs root; `ensure_installed()` apt-installs slurm-wlm and munge when missing, about 15 s):

    from slurm import SlurmCluster, require_slurm

    @pytest.fixture(scope="module")
    def cluster():
        require_slurm()                       # skip, or fail with STRATA_REQUIRE_SLURM=1, if it can't be had
        c = SlurmCluster("contrib/slurm/burst_buffer.lua", bb_conf="StageInTimeout=60",
                         env={"STRATA_BIN": ..., "STRATA_API": ...})   # env: seen by the Lua (slurmctld's)
        yield c
        c.close()

    j = cluster.sbatch("#!/bin/bash\n#BB_LUA strata claim=/x.yaml\nenv\n")   # as nobody; returns the id
    d = cluster.wait(j, "COMPLETED", 60)      # or states=("PENDING",), pred=lambda d: d["Priority"] == "0"
    d["JobState"], d["Reason"], d["Comment"], d["AdminComment"], d["SystemComment"], d["BurstBufferState"]
    cluster.output(j); cluster.scancel(j); cluster.logs(); cluster.wait_log(r"regex")
    cluster.run("scontrol", "show", "bbstat")  # any client command, SLURM_CONF set (user="..." via runuser)
    cluster.restart_slurmctld()                # controller restart on the same state (about 4 s)

SlurmCluster(lua_path=None, prolog=None, epilog=None, extra_conf="", *, lua_text=None, bb_conf="",
files=None, env=None, cpus=2, start_timeout=60) writes slurm.conf (+ burst_buffer.lua, burst_buffer.conf,
`files`) into a fresh /tmp/strata-slurm-* directory, starts munged (as munge), slurmctld and slurmd in the
foreground (-D) on two free loopback ports (CommunicationParameters=NoInAddrAny,NoCtldInAddrAny: both bind
127.0.0.1 only), and waits for the node to be idle: about 0.2 s. `env` is the environment of the test plus
SLURM_CONF. close() cancels the remaining jobs (their teardowns run), `scontrol shutdown`, then SIGTERM/SIGKILL
to whatever is left of ours (descendants of the daemons and any process whose environment holds this
SLURM_CONF: jobs, slurmstepd, detached children of the Lua), and removes the directory
(STRATA_KEEP_SLURM_DIR=1 keeps it). Clusters are independent; a new one after close() works (job ids restart
at 1). Settings that matter: SchedulerType=sched/backfill with bf_interval=1 (stage-in needs backfill);
DebugFlags=BurstBuffer; MinJobAge=3600 (finished jobs stay visible to `scontrol show job`).

What was learned about burst_buffer/lua in 22.05.8 (tests/python/test_slurm_harness.py checks most of it):

* burst_buffer.lua is read from slurm.conf's directory; burst_buffer.conf is optional (defaults:
  StageInTimeout=86400, StageOutTimeout=86400, OtherTimeout=300; Flags= e.g. TeardownFailure). Lua is 5.1;
  the `slurm` table has SUCCESS=0, ERROR=-1, log_info/log_error/log_debug*/log_verbose, error, time_str2mins
  and constants. All arguments are strings; return rc[, message].
* Signatures, in call order, and where they run:
    slurm_bb_job_process(job_script)                          at submission, inside slurmctld, locks held
    slurm_bb_pools()                                          at start and about every 30 s, inside slurmctld
    slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)   forked (slurmscriptd), OtherTimeout
    slurm_bb_data_in(job_id, job_script)                      forked, StageInTimeout
    slurm_bb_real_size(job_id)                                forked; only when the job asked for a size
    slurm_bb_paths(job_id, job_script, path_file)             inside slurmctld, locks held, no timeout
    slurm_bb_pre_run(job_id, job_script)                      forked, OtherTimeout (job CONFIGURING)
    slurm_bb_post_run(job_id, job_script)                     forked, OtherTimeout (JobState=STAGE_OUT)
    slurm_bb_data_out(job_id, job_script)                     forked, StageOutTimeout
    slurm_bb_job_teardown(job_id, job_script, hurry)          forked, OtherTimeout; hurry "true"/"false"
    slurm_bb_get_status(...)                                  `scontrol show bbstat ARGS`; prints its message
  job_process gets only the script in 22.05 (uid, gid, job_info come in 23.02: extra parameters are nil).
  pool is "(null)" and bb_size "0" for a bare `#BB_LUA` line. job_script is
  $StateSaveLocation/hash.<id%10>/job.<id>/script (root-owned copy). Never call scontrol from job_process,
  pools or paths: slurmctld holds its locks while they run.
* The Lua runs as SlurmUser (root here; `slurm` on a usual site), in slurmctld's working directory, with
  slurmctld's environment (whatever slurmctld was started with, plus nothing Slurm-specific but SLURM_CONF
  if it was set) and no job variables. io.popen and os.execute work in every function (Lua 5.1: p:close()
  gives no exit status, so echo `$?` into the output; os.execute returns the raw wait status, 15 when the
  child died of SIGTERM).
* Timing: a trivial `#BB_LUA` job completes about 1.3 s after sbatch. Pending jobs show
  Reason=BurstBufferResources until setup/data_in start (under 2 s), then Reason=BurstBufferStageIn and
  BurstBufferState=staging-in while data_in runs (the job stays PENDING), staged-in, running, post-run
  (JobState=STAGE_OUT, Reason=burst_buffer/lua:_Stage-out_in_progress), teardown, complete. Several jobs'
  data_in run at once.
* The paths file is empty; each `KEY=VALUE` line written to it (newline-terminated, value verbatim to the end
  of the line: spaces and '=' are kept, no quoting) is added to the job's environment.
* data_in returning slurm.ERROR, "msg": the job stays PENDING and is held (Priority=0),
  Reason=burst_buffer/lua:_slurm_bb_data_in:_msg (scontrol prints Reason with whitespace as '_'),
  SystemComment="MM/DD/YY HH:MM:SS burst_buffer/lua: data_in: msg", BurstBufferState stays staging-in,
  and the slurmctld log says "error: slurm_bb_data_in for JobId=N failed.". It is not retried and teardown is
  not run (unless Flags=TeardownFailure) until scancel, which runs teardown(hurry="true") and leaves it
  CANCELLED with that Reason (by the source, a failing setup is the same with slurm_bb_setup/setup).
  job_process returning an error refuses the submission: sbatch exits 1 with
  "sbatch: error: burst_buffer/lua: msg" and "Batch job submission failed: Burst Buffer request invalid".
* `scontrol update jobid=N Comment=...` / `AdminComment=...` from data_in and pre_run works (setup runs the
  same way), no deadlock (each about 10 ms); `scontrol show job` shows it at once (Reason flips to None
  until the next scheduler pass sets BurstBufferStageIn again). From post_run, data_out and teardown it fails: "Job has
  already finished for job N" (exit 1), so an AdminComment cannot be recorded at teardown in 22.05.
* A long data_in is killed at StageInTimeout: SIGTERM to its process group, SIGKILL 10 ms later; the job is
  then held like a failure with Reason=burst_buffer/lua:_slurm_bb_data_in:_Timeout_@_<ms>_msec (the Lua's
  own message is not read). Pitfall: if the Lua survives the SIGTERM (it was blocked in os.execute/io.popen,
  whose child died) and returns slurm.SUCCESS within those 10 ms, the stage-in counts as done and the job
  RUNS (seen with an unchecked os.execute("sleep ...")): check every command's status, and keep the Lua's
  own deadline below StageInTimeout.
* A function's end is detected by EOF on a pipe its process inherited: a background child started from the
  Lua (`cmd &`) keeps the function "running" until it exits, or until the timeout kills it, and then the
  value the Lua returned counts (a "Timeout" in the log, yet the job ran). To detach one, close the
  inherited descriptors and leave the process group (checked: the function returns at once):
  setsid -f bash -c 'for f in /proc/self/fd/*; do n=${f##*/}; [ $n -gt 2 ] && eval "exec $n>&-"; done;
  exec CMD' </dev/null >/dev/null 2>&1
* scancel while data_in runs kills it ("data_in for JobId=N terminated by slurmctld") and queues
  teardown(hurry="true") within about 0.5 s; the job is CANCELLED. Race in 22.05: about 1 in 8 times the
  kill also hits the teardown just started ("teardown for JobId=N terminated by slurmctld"); BurstBufferState
  then stays `teardown` and teardown only runs again (hurry="false") when slurmctld restarts. Anything
  teardown releases therefore needs its own expiry (a TTL).
"""
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")


def ensure_installed(timeout=600):
    """Make sure munge and Slurm are installed: apt-get installs them when a binary is missing.

    Returns ``(True, "")`` when everything is there (or was just installed), ``(False, reason)`` when it cannot
    be (not root, no apt-get, apt failed, the burst_buffer/lua plugin is absent, ...).
    """
    def missing():
        return [b for b in DAEMONS if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]

    def plugin():
        for d in ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm", "/usr/lib/slurm",
                  "/usr/lib64/slurm"):
            if os.path.exists(os.path.join(d, "burst_buffer_lua.so")):
                return True
        return False

    if not missing():
        return (True, "") if plugin() else (False, "Slurm is installed but burst_buffer_lua.so is not")
    if os.geteuid() != 0:
        return False, f"missing {', '.join(missing())} and not root (apt-get install -y {' '.join(PACKAGES)})"
    if shutil.which("apt-get") is None:
        return False, f"missing {', '.join(missing())} and no apt-get"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", *PACKAGES]
    last = ""
    for attempt in range(2):
        try:
            if attempt == 1:  # the package lists may be stale or absent
                subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=timeout)
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            last = str(e)
            continue
        if r.returncode == 0 and not missing():
            break
        last = (r.stderr or r.stdout).strip()[-500:]
    else:
        return False, f"apt-get install {' '.join(PACKAGES)} failed: {last}"
    if not plugin():
        return False, "Slurm installed but burst_buffer_lua.so is not"
    return True, ""


def require_slurm():
    """For tests: skip (or, with STRATA_REQUIRE_SLURM=1, fail) when Slurm cannot be installed here."""
    import pytest
    ok, why = ensure_installed()
    if not ok:
        if os.environ.get("STRATA_REQUIRE_SLURM") == "1":
            pytest.fail(f"STRATA_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    if os.geteuid() != 0:
        msg = "a Slurm cluster needs root (SlurmUser=root, munged as munge, jobs as nobody)"
        if os.environ.get("STRATA_REQUIRE_SLURM") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def _free_port():
    from conftest import free_port  # below the ephemeral range, never the same twice

    return free_port()


def _sbin(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


# Keys `scontrol show job` prints (src/api/job_info.c, 22.05) that are not found by the generic rule, and the
# fields whose values are free text (may hold spaces and `Word=` tokens).
_FREE_TEXT = {"Comment", "AdminComment", "SystemComment", "JobName", "Command", "WorkDir", "StdOut", "StdErr",
              "StdIn", "BurstBuffer", "Features", "MailUser"}
_KNOWN = set(
    "JobId JobName UserId GroupId MCS_label Priority Nice Account QOS WCKey JobState Reason Dependency Requeue "
    "Restarts BatchFlag Reboot ExitCode DerivedExitCode RunTime TimeLimit TimeMin SubmitTime EligibleTime "
    "AccrueTime StartTime EndTime Deadline SuspendTime SecsPreSuspend LastSchedEval Scheduler Partition "
    "AllocNode:Sid ReqNodeList ExcNodeList NodeList BatchHost NumNodes NumCPUs NumTasks CPUs/Task ReqB:S:C:T "
    "TRES Socks/Node NtasksPerN:B:S:C CoreSpec MinCPUsNode MinMemoryNode MinMemoryCPU MinTmpDiskNode Features "
    "DelayBoot OverSubscribe Contiguous Licenses Network Command WorkDir Comment AdminComment SystemComment "
    "StdErr StdIn StdOut BurstBuffer BurstBufferState Power MailUser MailType CpusPerTres MemPerTres "
    "TresPerNode TresPerJob TresPerSocket TresPerTask ArrayJobId ArrayTaskId HetJobId HetJobOffset "
    "HetJobIdSet Reservation Prefer ClusterFeatures BatchFeatures Container SELinuxContext PreemptTime "
    "PreemptEligibleTime ResizeTime Switches ThreadSpec TresBind TresFreq CronJob CrontabSpec "
    "KillOInInvalidDependent SpreadJob FedOrigin FedViableSiblings FedActiveSiblings GresEnforceBind "
    "NtasksPerTRES OOMKillStep".split())
_KEY = re.compile(r"^([A-Z][A-Za-z0-9_:/]*)=(.*)$", re.S)


def parse_scontrol(text):
    """Parse `scontrol show job -o` (or any `scontrol show ... -o`) output of one record into a dict."""
    out, key = {}, None
    for tok in text.replace("\n", " ").split(" "):
        m = _KEY.match(tok)
        if m and (key is None or m.group(1) in _KNOWN or key not in _FREE_TEXT) and m.group(1) not in out:
            key = m.group(1)
            out[key] = m.group(2)
        elif key is not None:
            out[key] += " " + tok
    for k in list(out):
        out[k] = out[k].rstrip()
    return out


class SlurmError(RuntimeError):
    pass


class SlurmCluster:
    """One slurmctld + one slurmd (+ munged) in a fresh temporary directory, on free loopback ports.

    lua_path: the burst_buffer.lua to install (copied next to slurm.conf), or lua_text: its text.
    prolog / epilog: paths of scripts to install as Prolog= / Epilog= (run as root by slurmd).
    extra_conf: more slurm.conf lines.  bb_conf: the text of burst_buffer.conf (none when empty).
    files: {name: text} written next to slurm.conf (e.g. a site file the Lua reads).
    env: extra environment for slurmctld, so also for every slurm_bb_* call (they inherit it).
    """

    def __init__(self, lua_path=None, prolog=None, epilog=None, extra_conf="", *, lua_text=None, bb_conf="",
                 files=None, env=None, cpus=2, start_timeout=60):
        self.dir = tempfile.mkdtemp(prefix="strata-slurm-")
        self.procs = {}
        self._submitted = 0
        self._closed = False
        try:
            self._write(lua_path, lua_text, prolog, epilog, extra_conf, bb_conf, files or {}, cpus)
            self._start(env or {}, start_timeout)
        except BaseException:
            self.close()
            raise

    # ---- set-up ---------------------------------------------------------------------------------------------
    def _write(self, lua_path, lua_text, prolog, epilog, extra_conf, bb_conf, files, cpus):
        d = self.dir
        os.chmod(d, 0o755)  # munged checks every directory on its paths; jobs (as nobody) read below it
        self.host = socket.gethostname().split(".")[0]
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = _free_port()
        munge = pwd.getpwnam("munge")
        self.munge_dir = os.path.join(d, "munge")
        os.mkdir(self.munge_dir, 0o755)
        os.chown(self.munge_dir, munge.pw_uid, munge.pw_gid)
        for sub in ("state", "spool", "log"):
            os.mkdir(os.path.join(d, sub), 0o755)
        self.jobs_dir = os.path.join(d, "jobs")
        os.mkdir(self.jobs_dir)
        os.chmod(self.jobs_dir, 0o1777)
        self.conf = os.path.join(d, "slurm.conf")
        self.ctld_log = os.path.join(d, "log", "slurmctld.log")
        self.slurmd_log = os.path.join(d, "log", "slurmd.log")
        lines = [
            "ClusterName=test",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            # Bind to the node's address (127.0.0.1) instead of INADDR_ANY.
            "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_dir}/munge.sock",
            "CredType=cred/munge",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={self.ctld_log}",
            f"SlurmdLogFile={self.slurmd_log}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "DebugFlags=BurstBuffer",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1,sched_min_interval=100000",
            "BurstBufferType=burst_buffer/lua",
            "MinJobAge=3600",
            "KillWait=2",
            "InactiveLimit=0",
        ]
        for name, path in (("Prolog", prolog), ("Epilog", epilog)):
            if path:
                dst = os.path.join(d, name.lower() + ".sh")
                shutil.copyfile(path, dst)
                os.chmod(dst, 0o755)
                lines.append(f"{name}={dst}")
        lines += [l.strip() for l in extra_conf.splitlines() if l.strip()]
        lines += [
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        lua = os.path.join(d, "burst_buffer.lua")
        if lua_text is not None:
            with open(lua, "w") as f:
                f.write(lua_text)
        elif lua_path is not None:
            shutil.copyfile(lua_path, lua)
        else:
            raise ValueError("lua_path or lua_text is required (BurstBufferType=burst_buffer/lua)")
        if bb_conf:
            with open(os.path.join(d, "burst_buffer.conf"), "w") as f:
                f.write(bb_conf.rstrip("\n") + "\n")
        for name, text in files.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def _start(self, extra_env, timeout):
        m = self.munge_dir
        os.makedirs("/run/munge", exist_ok=True)
        key = os.path.join(m, "munge.key")
        munge = dict(user="munge", group="munge", extra_groups=[])
        subprocess.run([_sbin("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True,
                       cwd=m, **munge)
        self._spawn("munged", [_sbin("munged"), "--foreground", f"--key-file={key}", f"--socket={m}/munge.sock",
                               f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                               f"--seed-file={m}/munged.seed"], cwd=m, **munge)
        self._wait_for(lambda: os.path.exists(f"{m}/munge.sock"), 10, "munged's socket")
        # The slurm_bb_* functions inherit slurmctld's environment and working directory.
        self.ctld_env = dict(self.env, **extra_env)
        self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-f", self.conf], env=self.ctld_env)
        self._spawn("slurmd", [_sbin("slurmd"), "-D", "-f", self.conf, "-N", self.host])
        self._wait_for(lambda: self._listening(self.ctld_port), timeout, "slurmctld's port")
        self._wait_for(lambda: self._sinfo_state() == "idle", timeout, "the node to be idle")

    def restart_slurmctld(self, timeout=60):
        """Stop slurmctld (`scontrol shutdown slurmctld`: slurmd and the jobs stay) and start it again on the
        same state, as after a controller crash or upgrade; waits until it answers again."""
        p = self.procs["slurmctld"]
        self.run("scontrol", "shutdown", "slurmctld", check=False)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-f", self.conf], env=self.ctld_env)
        # Clients retry a refused connection with back-off (seconds): ask only once the port listens.
        self._wait_for(lambda: self._listening(self.ctld_port), timeout, "slurmctld's port")
        self._wait_for(lambda: self._sinfo_state() in ("idle", "mixed", "allocated"), timeout,
                       "slurmctld to answer after its restart")

    @staticmethod
    def _listening(port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    def _spawn(self, name, argv, env=None, cwd=None, **kw):
        out = open(os.path.join(self.dir, "log", f"{name}.stderr"), "wb")
        try:
            self.procs[name] = subprocess.Popen(argv, env=env or self.env, cwd=cwd or self.dir,
                                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True, **kw)
        finally:
            out.close()

    def _wait_for(self, pred, timeout, what):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise SlurmError(f"{name} exited with {p.returncode} while waiting for {what}:\n"
                                     f"{self._tail(os.path.join(self.dir, 'log', name + '.stderr'))}\n"
                                     f"{self.logs()}")
            if pred():
                return
            time.sleep(0.1)
        raise SlurmError(f"timed out waiting for {what}\n{self.logs()}")

    def _sinfo_state(self):
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=20)
        return r.stdout.strip() if r.returncode == 0 else None

    # ---- commands -------------------------------------------------------------------------------------------
    def run(self, *argv, user=None, check=True, timeout=60, input=None):
        """Run a Slurm client command (as root, or as `user` through runuser) with SLURM_CONF set."""
        cmd = list(argv)
        if user and user != "root":
            cmd = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.conf}", *cmd]
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise SlurmError(f"{shlex.join(cmd)} exited with {r.returncode}: {r.stderr.strip()}")
        return r

    def sbatch(self, script_text, user="nobody", extra_args=(), check=True):
        """Submit a batch script as `user` (root is refused burst buffers); returns the job id (an int).

        The script and its default output (`<jobs>/job-N.out`, stdout and stderr) live in a world-writable
        directory; the job runs there. With check=False a refused submission returns the CompletedProcess.
        """
        self._submitted += 1
        n = self._submitted
        path = os.path.join(self.jobs_dir, f"job-{n}.sh")
        with open(path, "w") as f:
            f.write(script_text)
        os.chmod(path, 0o755)
        args = list(extra_args)
        if not any(a.startswith(("-o", "--output")) for a in args):
            args.append(f"--output={self.jobs_dir}/job-{n}.out")
        r = self.run("sbatch", "--parsable", f"--chdir={self.jobs_dir}", *args, path, user=user, check=False)
        if r.returncode != 0:
            if check:
                raise SlurmError(f"sbatch exited with {r.returncode}: {r.stderr.strip()}\n{self.logs(20)}")
            return r
        return int(r.stdout.strip().split(";")[0])

    def job(self, job_id):
        """`scontrol show job -o <id>` as a dict (JobState, Reason, Priority, Comment, AdminComment,
        SystemComment, ExitCode, StdOut, BurstBuffer, BurstBufferState, ...), all values strings; the three
        comments are None when unset (scontrol omits them). None if the job is unknown (or purged)."""
        r = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if r.returncode != 0 or not r.stdout.strip():
            return None
        d = parse_scontrol(r.stdout.strip())
        for k in ("Comment", "AdminComment", "SystemComment"):  # printed only when set
            d.setdefault(k, None)
        return d

    def wait(self, job_id, states=("COMPLETED",), timeout=60, pred=None):
        """Poll until the job's JobState is one of `states` (a string or several) and pred(job) holds;
        returns the job dict. Raises SlurmError (with the job and the slurmctld log) on timeout."""
        if isinstance(states, str):
            states = (states,)
        deadline = time.time() + timeout
        j = None
        while time.time() < deadline:
            j = self.job(job_id)
            if j is not None and (not states or j.get("JobState") in states) and (pred is None or pred(j)):
                return j
            time.sleep(0.2)
        raise SlurmError(f"job {job_id} not in {states} after {timeout}s: {j}\n{self.logs()}")

    def scancel(self, job_id, *args):
        self.run("scancel", *args, str(job_id))

    def output(self, job_id):
        """The text of the job's StdOut file ('' when not written yet)."""
        j = self.job(job_id)
        path = j and j.get("StdOut")
        try:
            with open(path) as f:
                return f.read()
        except (OSError, TypeError):
            return ""

    def logs(self, lines=200, which="slurmctld"):
        """The last `lines` lines of the slurmctld log (where slurm.log_* from the Lua goes), or slurmd's."""
        return self._tail(self.ctld_log if which == "slurmctld" else self.slurmd_log, lines)

    def log_text(self):
        """The whole slurmctld log."""
        try:
            with open(self.ctld_log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_log(self, pattern, timeout=30):
        """Wait until the slurmctld log matches the regex; returns the match."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, self.log_text())
            if m:
                return m
            time.sleep(0.2)
        raise SlurmError(f"{pattern!r} not in the slurmctld log after {timeout}s\n{self.logs()}")

    @staticmethod
    def _tail(path, lines=200):
        try:
            with open(path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    # ---- shutdown -------------------------------------------------------------------------------------------
    def _ours(self):
        """Pids of every process that is ours: descendants of the daemons, and anything whose environment
        names this cluster's slurm.conf (jobs and slurmstepd, which may outlive their parent)."""
        children, env_hits = {}, set()
        marker = f"SLURM_CONF={self.conf}".encode()
        for e in os.listdir("/proc"):
            if not e.isdigit():
                continue
            pid = int(e)
            try:
                with open(f"/proc/{e}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(pid)
                with open(f"/proc/{e}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        env_hits.add(pid)
            except (OSError, ValueError, IndexError):
                continue
        found, todo = set(), [p.pid for p in self.procs.values() if p.poll() is None] + list(env_hits)
        while todo:
            pid = todo.pop()
            if pid in found or pid == os.getpid():
                continue
            found.add(pid)
            todo.extend(children.get(pid, []))
        return found

    def close(self):
        if self._closed:
            return
        self._closed = True
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                r = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True,
                                   timeout=20)
                ids = r.stdout.split()
                if ids:  # cancelled jobs get their teardown (hurry=true) before the daemons stop
                    subprocess.run(["scancel", "--full", *ids], env=self.env, capture_output=True, timeout=20)
                    deadline = time.time() + 5
                    while time.time() < deadline and subprocess.run(
                            ["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True,
                            timeout=20).stdout.strip():
                        time.sleep(0.2)
                subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True, timeout=20)
            except (OSError, subprocess.SubprocessError):
                pass
            deadline = time.time() + 10
            while time.time() < deadline and any(
                    self.procs[n].poll() is None for n in ("slurmctld", "slurmd") if n in self.procs):
                time.sleep(0.1)
        for sig, grace in ((signal.SIGTERM, 3), (signal.SIGKILL, 3)):
            pids = self._ours()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + grace
            while time.time() < deadline:
                for p in self.procs.values():
                    p.poll()
                if not any(os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in pids):
                    break
                time.sleep(0.05)
        for p in self.procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if os.environ.get("STRATA_KEEP_SLURM_DIR") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class OriginGate:
    """A gate for the proxy in front of a test's origin (its `before` hook): while held, every object GET waits
    (listings pass), so a claim stays in staging for as long as a test needs to look at it, however slow or
    fast the machine; `release()` lets the waiting GETs go on."""

    def __init__(self):
        self._open = threading.Event()
        self._open.set()

    def hold(self):
        self._open.clear()

    def release(self):
        self._open.set()

    def before(self, method, path):
        if method == "GET" and "list-type=" not in path:
            self._open.wait(timeout=300)
