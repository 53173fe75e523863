--[[
Strata's burst buffer for Slurm (burst_buffer/lua, Slurm 22.05 and later).

A batch script declares its data with one line, naming a claim file:

    #BB_LUA strata claim=/shared/claims/train.yaml

or inline, the claim's YAML on `#STRATA` lines after it:

    #BB_LUA strata
    #STRATA version: 1
    #STRATA team: vision
    #STRATA datasets:
    #STRATA   - {name: train, location: origin/train/}

and Strata stages it before the job starts:

  job_process  the claim is validated (`strata claim validate`): a bad claim is refused at submission with the
               field that is wrong. A named claim file must be readable by every user (Slurm 22.05 does not
               say who submits at this point, and the file is read with the script's rights).
  setup        the claim (a named file read with the job user's rights) is submitted for the job (`--job <Slurm
               job id>`), as the site's Strata principal, after checking that the job's user is in the Unix
               group named like the claim's team.
  data_in      waits until the claim is ready; the job stays pending (Reason=BurstBufferStageIn) and its
               Comment shows the staging progress. A claim that fails fails the stage-in: the job is held
               with the claim's reason (Reason, SystemComment, Comment), then cancelled after
               STRATA_FAIL_GRACE_SECS, which releases the claim.
  paths        exports the claim's environment to the job (STRATA_AGENT, STRATA_CLAIM, STRATA_DATASET_<NAME>,
               STRATA_MOUNT_<NAME>, STRATA_SCRATCH, ...), as data_in saved it.
  pre_run      records the claim and its staging in the job's AdminComment (`strata:{...}`; Slurm 22.05
               refuses updates to a job that has finished, so the final accounting stays with the claim:
               `strata claim ls --job <id> --all`).
  teardown     releases the claim (also on scancel; a teardown Slurm kills is covered by the claim's TTL).

Site settings, each an environment variable of slurmctld with a default (or set them in
`strata_site.lua` next to this file, as plain Lua assignments to the same names):

  STRATA_BIN            the strata binary                          /usr/local/bin/strata
  STRATA_API            the agent's control API                    http://127.0.0.1:7070
  STRATA_TOKEN_FILE     a file holding the site's bearer token     /etc/strata/slurm.token
  STRATA_STATE_DIR      where job id -> claim id is kept           /var/spool/strata-slurm
  STRATA_TEAM_GROUPS    "1": the user must be in the team's group  1
  STRATA_WAIT_SECS      longest stage-in wait; keep it below         86000
                        burst_buffer.conf's StageInTimeout (86400)
  STRATA_FAIL_GRACE_SECS  how long a job whose claim failed stays    60
                        held (its reason visible) before it is
                        cancelled

Functions Slurm calls with slurmctld's locks held (job_process, paths) touch no network: job_process runs
`strata claim validate` (local, milliseconds), paths copies the environment data_in saved. None calls
scontrol.
--]]

local lua_script_name = "burst_buffer.lua (strata)"

local function setting(name, default)
	local v = os.getenv(name)
	if v ~= nil and v ~= "" then
		return v
	end
	return default
end

STRATA_BIN = setting("STRATA_BIN", "/usr/local/bin/strata")
STRATA_API = setting("STRATA_API", "http://127.0.0.1:7070")
STRATA_TOKEN_FILE = setting("STRATA_TOKEN_FILE", "/etc/strata/slurm.token")
STRATA_STATE_DIR = setting("STRATA_STATE_DIR", "/var/spool/strata-slurm")
STRATA_TEAM_GROUPS = setting("STRATA_TEAM_GROUPS", "1")
STRATA_WAIT_SECS = tonumber(setting("STRATA_WAIT_SECS", "86000"))
STRATA_FAIL_GRACE_SECS = tonumber(setting("STRATA_FAIL_GRACE_SECS", "60"))

do
	local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
	local site = io.open(here .. "strata_site.lua", "r")
	if site ~= nil then
		site:close()
		dofile(here .. "strata_site.lua")
	end
end

-- A shell word: '...' with embedded quotes escaped.
local function q(s)
	return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Run a command; returns ok, its output (stdout and stderr).
local function run(cmd)
	local env = "STRATA_LOG=error STRATA_API=" .. q(STRATA_API)
	local tf = io.open(STRATA_TOKEN_FILE, "r")
	if tf ~= nil then
		local token = tf:read("*l")
		tf:close()
		if token ~= nil and token ~= "" then
			env = env .. " STRATA_TOKEN=" .. q(token)
		end
	end
	local p = io.popen(env .. " " .. cmd .. " 2>&1; echo \"__rc=$?\"")
	local out = p:read("*a")
	p:close()
	local rc = tonumber(out:match("__rc=(%d+)%s*$")) or 1
	out = out:gsub("__rc=%d+%s*$", "")
	out = out:gsub("%s+$", "")
	return rc == 0, out, rc
end

-- The last line of a command's output (where our commands print their answer).
local function last_line(s)
	local l = s
	for line in s:gmatch("[^\n]+") do
		l = line
	end
	return l
end

-- The Strata directives of a job script: nil if it has none; else the claim file's path, or the inline claim.
local function directives(job_script)
	local f = io.open(job_script, "r")
	if f == nil then
		return nil, "cannot read the job script " .. job_script
	end
	local found, path, inline = false, nil, {}
	for line in f:lines() do
		local args = line:match("^#BB_LUA%s+strata(.*)$")
		if args ~= nil then
			found = true
			path = args:match("claim=(%S+)") or path
		end
		local y = line:match("^#STRATA ?(.*)$")
		if y ~= nil then
			table.insert(inline, y)
		end
	end
	f:close()
	if not found then
		return nil
	end
	if path == nil and #inline == 0 then
		return nil, "#BB_LUA strata: name a claim (claim=FILE) or write it on #STRATA lines"
	end
	if path ~= nil and #inline > 0 then
		return nil, "#BB_LUA strata: a claim file or #STRATA lines, not both"
	end
	return { path = path, inline = table.concat(inline, "\n") .. "\n" }
end

local function mkdirs(path)
	os.execute("mkdir -p " .. q(path) .. " && chmod 0700 " .. q(path))
end

-- The claim document of a job as a file the CLI reads (inline claims are written to the state dir).
-- The claim document of a job as a file in the state dir: inline claims as written, a named file read with
-- the job user's own rights (the script runs as SlurmUser, which can read files the user cannot).
local function claim_file(job_id, uid, gid, d)
	mkdirs(STRATA_STATE_DIR)
	local path = STRATA_STATE_DIR .. "/" .. tostring(job_id) .. ".yaml"
	if d.path ~= nil then
		local ok, out = run("setpriv --reuid=" .. q(uid) .. " --regid=" .. q(gid) .. " --init-groups cat -- "
			.. q(d.path) .. " > " .. q(path))
		if not ok then
			return nil, "cannot read the claim file " .. d.path .. " as the job's user: " .. last_line(out)
		end
		return path
	end
	local f = io.open(path, "w")
	f:write(d.inline)
	f:close()
	return path
end

local function state_file(job_id)
	return STRATA_STATE_DIR .. "/" .. tostring(job_id) .. ".claim"
end

local function claim_id(job_id)
	local f = io.open(state_file(job_id), "r")
	if f == nil then
		return nil
	end
	local id = f:read("*l")
	f:close()
	return id
end

local function comment(job_id, text)
	-- The job's Comment: what a person sees in `squeue -o %k` or `scontrol show job` while it waits.
	run("scontrol update jobid=" .. tostring(job_id) .. " Comment=" .. q(text:sub(1, 250)))
end

function slurm_bb_job_process(job_script, uid, gid, job_info)
	local d, err = directives(job_script)
	if d == nil then
		if err ~= nil then
			return slurm.ERROR, err
		end
		return slurm.SUCCESS
	end
	local cmd
	if d.path ~= nil then
		-- Slurm 22.05 does not say who submits here, so a named file must be one every user may read (its
		-- contents could otherwise reach the submitter through the error); setup reads it as the user.
		local readable = run("runuser -u nobody -- test -r " .. q(d.path))
		if not readable then
			return slurm.ERROR, "strata: claim file " .. d.path .. " is not readable by every user (or does not exist)"
		end
		cmd = STRATA_BIN .. " claim validate --job pending " .. q(d.path)
	else
		-- The inline claim through stdin: no file is written while slurmctld holds its locks.
		cmd = "printf %s " .. q(d.inline) .. " | " .. STRATA_BIN .. " claim validate --job pending -"
	end
	local ok, out = run(cmd)
	if not ok then
		return slurm.ERROR, "strata: " .. out
	end
	return slurm.SUCCESS
end

function slurm_bb_pools()
	return slurm.SUCCESS
end

-- The Unix groups of a user id.
local function groups_of(uid)
	local ok, out = run("id -Gn " .. q(uid))
	local set = {}
	if ok then
		for g in out:gmatch("%S+") do
			set[g] = true
		end
	end
	return set
end

-- Run a command detached from this function's process: Slurm waits for EOF on pipes the function's process
-- holds, so the child closes every inherited descriptor and leaves the process group.
local function detach(cmd)
	os.execute("setsid -f bash -c " .. q("for f in /proc/self/fd/*; do n=${f##*/}; [ \"$n\" -gt 2 ] 2>/dev/null && eval \"exec $n>&-\" 2>/dev/null; done; exec " .. cmd) .. " </dev/null >/dev/null 2>&1")
end

local function env_file(job_id)
	return STRATA_STATE_DIR .. "/" .. tostring(job_id) .. ".env"
end

-- Fail a job whose claim cannot be had: held now with `reason` (Reason, SystemComment, Comment), cancelled
-- after the grace period (which runs teardown).
local function fail(job_id, reason)
	comment(job_id, reason)
	detach("sh -c " .. q("sleep " .. STRATA_FAIL_GRACE_SECS .. "; scancel " .. tostring(job_id)))
	return slurm.ERROR, reason
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
	local d, err = directives(job_script)
	if d == nil then
		if err ~= nil then
			return fail(job_id, err)
		end
		return slurm.SUCCESS
	end
	local file, ferr = claim_file(job_id, uid, gid, d)
	if file == nil then
		os.remove(STRATA_STATE_DIR .. "/" .. tostring(job_id) .. ".yaml")
		return fail(job_id, "strata: " .. ferr)
	end
	-- A refused job leaves nothing in the state dir (Slurm runs no teardown for it).
	local function refuse(reason)
		os.remove(file)
		return fail(job_id, reason)
	end
	local ok, out = run(STRATA_BIN .. " claim validate --job " .. q(job_id) .. " " .. q(file) .. " --json")
	if not ok then
		return refuse("strata: " .. last_line(out))
	end
	local team = out:match('"team"%s*:%s*"([^"]+)"')
	if STRATA_TEAM_GROUPS == "1" and (team == nil or not groups_of(uid)[team]) then
		return refuse("strata: user " .. tostring(uid) .. " is not in the Unix group of team " .. tostring(team))
	end
	ok, out = run(STRATA_BIN .. " claim submit " .. q(file) .. " --job " .. q(job_id) .. " --json")
	local id = out:match('"id"%s*:%s*"(claim_[^"]+)"')
	if not ok or id == nil then
		return refuse("strata: " .. last_line(out))
	end
	mkdirs(STRATA_STATE_DIR)
	local f = io.open(state_file(job_id), "w")
	f:write(id .. "\n")
	f:close()
	comment(job_id, "strata: claim " .. id .. " submitted")
	return slurm.SUCCESS
end

function slurm_bb_data_in(job_id, job_script)
	local id = claim_id(job_id)
	if id == nil then
		return slurm.SUCCESS -- not a Strata job
	end
	local deadline = os.time() + STRATA_WAIT_SECS
	while true do
		-- One short wait at a time, so the Comment follows the progress.
		local ok, out, rc = run(STRATA_BIN .. " claim wait " .. q(id) .. " --timeout 5s")
		if ok then
			-- The job's environment, saved now: paths runs with slurmctld's locks held and must not wait.
			local eok, env = run(STRATA_BIN .. " claim env " .. q(id) .. " --json")
			if not eok then
				return slurm.ERROR, "strata: " .. env
			end
			local f = io.open(env_file(job_id), "w")
			for k, v in env:gmatch('"(STRATA_[A-Z0-9_]+)"%s*:%s*"([^"]*)"') do
				f:write(k .. "=" .. v .. "\n")
			end
			f:close()
			comment(job_id, "strata: claim " .. id .. " ready")
			return slurm.SUCCESS
		end
		if rc ~= 3 then
			return fail(job_id, last_line(out))
		end
		local lines = {}
		for line in out:gmatch("[^\n]+") do
			if not line:match("^claim .* still ") then
				table.insert(lines, line)
			end
		end
		if #lines > 0 then
			comment(job_id, "strata: " .. lines[#lines])
		end
		if os.time() >= deadline then
			return fail(job_id, "strata: claim " .. id .. " not ready after " .. STRATA_WAIT_SECS .. " s")
		end
	end
end

function slurm_bb_real_size(job_id)
	return slurm.SUCCESS
end

function slurm_bb_paths(job_id, job_script, path_file)
	local src = io.open(env_file(job_id), "r")
	if src == nil then
		return slurm.SUCCESS -- not a Strata job
	end
	local env = src:read("*a")
	src:close()
	local f = io.open(path_file, "a")
	f:write(env)
	f:close()
	return slurm.SUCCESS
end

function slurm_bb_pre_run(job_id, job_script)
	local id = claim_id(job_id)
	if id == nil then
		return slurm.SUCCESS
	end
	-- The last moment Slurm 22.05 lets a job's AdminComment change: the claim and what staging did.
	local ok, out = run(STRATA_BIN .. " claim status " .. q(id) .. " --json")
	if ok then
		local usage = out:match('"usage"%s*:%s*(%b{})') or "{}"
		run("scontrol update jobid=" .. tostring(job_id) .. " AdminComment=" .. q('strata:{"claim":"' .. id .. '","usage":' .. usage:gsub("%s+", "") .. "}"))
	end
	return slurm.SUCCESS
end

function slurm_bb_post_run(job_id, job_script)
	return slurm.SUCCESS
end

function slurm_bb_data_out(job_id, job_script)
	return slurm.SUCCESS
end

function slurm_bb_job_teardown(job_id, job_script, hurry)
	local id = claim_id(job_id)
	if id == nil then
		return slurm.SUCCESS
	end
	local why = hurry == "true" and "cancelled" or "ended"
	local ok, out = run(STRATA_BIN .. " claim release " .. q(id) .. " --reason " .. q("slurm job " .. tostring(job_id) .. " " .. why))
	if not ok then
		-- Kept: the claim's TTL releases it if the agent cannot be reached now.
		slurm.log_info("%s: releasing claim %s of job %s: %s", lua_script_name, id, tostring(job_id), out)
		return slurm.ERROR, "strata: " .. out
	end
	for _, f in ipairs({ state_file(job_id), env_file(job_id), STRATA_STATE_DIR .. "/" .. tostring(job_id) .. ".yaml" }) do
		os.remove(f)
	end
	return slurm.SUCCESS
end

function slurm_bb_get_status(...)
	return slurm.SUCCESS, ""
end
