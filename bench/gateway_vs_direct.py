#!/usr/bin/env python3
"""The S3 gateway side by side with its baselines, in one run.

1. s5cmd with 16 workers (16 concurrent clients) (a) straight at the origin S3 server (moto), (b) through the gateway with an empty cache, (c) through
   the gateway again (hot), for two data sets: 64 MiB objects and 16 KiB objects.
2. p50/p99 latency of one 16 KiB GET (presigned URL, one keep-alive connection): gateway hot vs origin.
3. The practical limit: nginx serving the same bytes as static files vs the hot gateway serving presigned URLs,
   fetched by wrk at the same concurrency (16).
Peak RSS of `strata serve` is reported against RAM tier + in-flight budget + 150 MiB.

    python3 bench/gateway_vs_direct.py [--large-mib 2048] [--small-count 20000] [--rounds 3] [--sets large,small]
        [--skip-nginx] [--pin-origin] [--pin-wrk] [--wrk-rounds 5] [--hot-ttl-ms 60000]

Needs .venv (scripts/test.sh), a release build (cargo build --release -p strata-cli) and, for part 3, nginx
and wrk (apt-get install -y nginx wrk).
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from warm_vs_s5cmd import cpu_seconds, free_port, peak_rss_mib, settle, start_serve, wait_port  # noqa: E402

RAM_MIB, INFLIGHT_MIB = 1024, 512
AK, SK = "benchkey", "bench-secret-key"
# --pin-origin: the CPUs s5cmd and the gateway run on (the origin gets the last one), else None.
PIN_CLIENT = None
# --pin-wrk: (the CPUs of the server under test, the CPU of wrk), else None.
PIN_WRK = None


def s5(endpoint, *args, workers=16):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK, AWS_REGION="us-east-1")
    cmd = [os.path.join(VENV, "s5cmd"), "--endpoint-url", endpoint]
    if PIN_CLIENT:
        cmd = ["taskset", "-c", PIN_CLIENT] + cmd
    if workers:
        cmd += ["--numworkers", str(workers)]
    t0 = time.perf_counter()
    subprocess.run(cmd + list(args), env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


class Agent:
    def __init__(self, work, origin, ttl_ms, extra=""):
        self.data = os.path.join(work, f"agent-{ttl_ms}")
        shutil.rmtree(self.data, ignore_errors=True)
        cfg = os.path.join(work, f"strata-{ttl_ms}.toml")
        with open(cfg, "w") as f:
            f.write(f"""
[cache]
ram_capacity = "{RAM_MIB}MiB"
disk_capacity = "8GiB"
inflight_budget = "{INFLIGHT_MIB}MiB"
metadata_ttl_ms = {ttl_ms}
{extra}
[gateway]
[[gateway.keys]]
access_key = "{AK}"
secret_key = "{SK}"
[[backends]]
name = "bench"
url = "s3://bench"
[backends.options]
endpoint = "{origin}"
access_key_id = "{AK}"
secret_access_key = "{SK}"
""")
        self.proc, self.endpoint = start_serve(cfg, self.data, addr="s3.addr")
        if PIN_CLIENT:  # every thread of the gateway (later ones inherit it)
            subprocess.run(["taskset", "-a", "-p", "-c", PIN_CLIENT, str(self.proc.pid)], check=True,
                           stdout=subprocess.DEVNULL)

    def metrics(self, *names):
        """Values of unlabelled (or exactly labelled) series of the gateway's /metrics, by name."""
        api = open(os.path.join(self.data, "api.addr")).read().strip()
        base = api if api.startswith("http") else f"http://{api}"
        token = open(os.path.join(self.data, "admin-token")).read().strip()
        req = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read().decode()
        found = {}
        for line in text.splitlines():
            for name in names:
                if line.startswith(name + " "):
                    found[name] = int(float(line.split()[-1]))
        return found

    def fills(self):
        """(origin requests, blocks filled, disk writes dropped) so far."""
        try:
            m = self.metrics("strata_cache_fill_requests_total", "strata_cache_fills_total",
                             'strata_cache_disk_errors_total{kind="queue_full"}')
        except OSError:
            return (0, 0, 0)
        return (m.get("strata_cache_fill_requests_total", 0), m.get("strata_cache_fills_total", 0),
                m.get('strata_cache_disk_errors_total{kind="queue_full"}', 0))

    def refreshes(self):
        """The gateway's metadata refresh counters (HEADs and directory listings), from its /metrics."""
        try:
            found = self.metrics("strata_cache_metadata_refreshes_total",
                                 "strata_cache_metadata_refresh_lists_total")
        except OSError as e:
            return f"unavailable ({e})"
        return (f"{found.get('strata_cache_metadata_refreshes_total', 0)} entries refreshed with "
                f"{found.get('strata_cache_metadata_refresh_lists_total', 0)} directory listings and a HEAD each "
                f"for the rest")

    def stop(self):
        print(f"metadata refresh-ahead of the gateway: {self.refreshes()}")
        rss, cpu = peak_rss_mib(self.proc.pid), cpu_seconds(self.proc.pid)
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.data, ignore_errors=True)
        return rss, cpu


def presigned(endpoint, keys):
    import boto3
    from botocore.config import Config
    c = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=AK, aws_secret_access_key=SK,
                     region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))
    return [c.generate_presigned_url("get_object", Params={"Bucket": "bench", "Key": k}, ExpiresIn=3600) for k in keys]


def latencies(urls, rounds=2):
    """Sequential GETs over one keep-alive connection; per-request seconds."""
    u = urllib.parse.urlsplit(urls[0])
    conn = http.client.HTTPConnection(u.hostname, u.port)
    out = []
    for _ in range(rounds):
        for url in urls:
            p = urllib.parse.urlsplit(url)
            t0 = time.perf_counter()
            conn.request("GET", p.path + "?" + p.query)
            r = conn.getresponse()
            body = r.read()
            out.append(time.perf_counter() - t0)
            assert r.status == 200 and len(body) == 16 * 1024, (r.status, len(body))
    return out


def first_byte(url, length):
    """One GET of bytes 0..length-1 (a client's 50 MiB part of a large object): seconds to the first body byte
    and to the last."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port)
    t0 = time.perf_counter()
    conn.request("GET", u.path + "?" + u.query, headers={"Range": f"bytes=0-{length - 1}"})
    r = conn.getresponse()
    first = r.read(1)
    t1 = time.perf_counter()
    rest = r.read()
    t2 = time.perf_counter()
    conn.close()
    assert r.status == 206 and len(first) + len(rest) == length, (r.status, len(first) + len(rest))
    return t1 - t0, t2 - t0


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def wrk(urls, work, name, seconds=10, conns=16):
    """wrk at `conns` connections cycling through `urls`; returns (requests/s, MiB/s)."""
    paths = os.path.join(work, f"{name}.paths")
    with open(paths, "w") as f:
        for url in urls:
            p = urllib.parse.urlsplit(url)
            f.write(p.path + ("?" + p.query if p.query else "") + "\n")
    script = os.path.join(work, f"{name}.lua")
    with open(script, "w") as f:
        f.write(f"""
local paths = {{}}
for line in io.lines("{paths}") do paths[#paths + 1] = line end
local i = 0
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
""")
    u = urllib.parse.urlsplit(urls[0])
    cmd = ["wrk", "-t", "2"]
    if PIN_WRK:
        cmd = ["taskset", "-c", PIN_WRK[1], "wrk", "-t", "1"]
    out = subprocess.run(cmd + ["-c", str(conns), "-d", f"{seconds}s", "-s", script,
                          f"http://{u.hostname}:{u.port}"], capture_output=True, text=True, check=True).stdout
    rps = float(next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec")))
    tr = next(line.split()[1] for line in out.splitlines() if line.startswith("Transfer/sec"))
    mult = {"KB": 1 / 1024, "MB": 1, "GB": 1024}
    mib = float(tr[:-2]) * mult.get(tr[-2:], 1 / (1024 * 1024))
    errors = [line for line in out.splitlines() if "Non-2xx" in line or "Socket errors" in line]
    if errors:
        print(f"  wrk {name}: {errors}")
    return rps, mib


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--large-mib", type=int, default=2048)
    ap.add_argument("--small-count", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-nginx", action="store_true")
    ap.add_argument("--pin-origin", action="store_true",
                    help="give the origin (moto) a CPU of its own and run s5cmd and the gateway on the others, in "
                         "every phase: the origin no longer competes with them for cores, as a remote S3 would not")
    ap.add_argument("--hot-ttl-ms", type=int, default=60000,
                    help="metadata TTL of the gateway in the latency and wrk phases (the default config: 60 s). Past "
                         "half of it every hot object is revalidated with a HEAD at the origin in the background, "
                         "which a co-located moto pays for on the cores the gateway, nginx and wrk share")
    ap.add_argument("--pin-wrk", action="store_true",
                    help="in the wrk phases, run wrk on the last CPU and the server under test (nginx, then the "
                         "gateway) on the others: the ratio then compares what each server does per CPU, without "
                         "the load generator taking its share of the same cores")
    ap.add_argument("--wrk-rounds", type=int, default=1,
                    help="wrk phases per object size, nginx and gateway alternating; the median ratio is reported")
    ap.add_argument("--cache-extra", default="",
                    help="more [cache] settings for the gateway, TOML lines separated by ';' (an experiment: "
                         "\"disk_write_queue = 8; readahead_blocks = 2\")")
    ap.add_argument("--ttfb", action="store_true",
                    help="also time a cold 50 MiB ranged GET of each of the first 4 large objects, to its first "
                         "byte and to its last, through a fresh gateway vs straight at the origin")
    ap.add_argument("--sets", default="large,small,small-ttl1",
                    help="s5cmd data sets to run: large (64 MiB, 60 s metadata TTL), small (16 KiB, 60 s), "
                         "small-ttl1 (16 KiB, 1 s)")
    a = ap.parse_args()
    extra = "\n".join(l.strip() for l in a.cache_extra.split(";") if l.strip())
    work = tempfile.mkdtemp(prefix="strata-gwbench-")
    port = free_port()
    origin_cmd = [os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    if a.pin_origin:
        global PIN_CLIENT
        last = os.cpu_count() - 1
        if last < 1:
            raise SystemExit("--pin-origin needs at least two CPUs")
        PIN_CLIENT = f"0-{last - 1}" if last > 1 else "0"
        origin_cmd = ["taskset", "-c", str(last)] + origin_cmd
    moto = subprocess.Popen(origin_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = {}
    try:
        wait_port(port)
        origin = f"http://127.0.0.1:{port}"
        s5(origin, "mb", "s3://bench")
        src = os.path.join(work, "src")
        os.makedirs(os.path.join(src, "large"))
        os.makedirs(os.path.join(src, "small"))
        for i in range(a.large_mib // 64):
            with open(os.path.join(src, "large", f"obj-{i:04}.bin"), "wb") as f:
                f.write(os.urandom(64 << 20))
        for i in range(a.small_count):
            with open(os.path.join(src, "small", f"s-{i:06}.bin"), "wb") as f:
                f.write(os.urandom(16 * 1024))
        if a.large_mib >= 64:
            s5(origin, "cp", src + "/large/*", "s3://bench/large/")
        s5(origin, "cp", src + "/small/*", "s3://bench/small/")
        print(f"data: {a.large_mib // 64} x 64 MiB and {a.small_count} x 16 KiB on moto at {origin}")

        sets = {"large": ("large", 60000), "small": ("small", 60000), "small-ttl1": ("small", 1000)}
        for ds, ttl in (sets[x] for x in a.sets.split(",") if x):
            times = {"direct": [], "cold": [], "hot": []}
            rss, cpu = [], []
            for r in range(a.rounds):
                dst = os.path.join(work, "out")
                shutil.rmtree(dst, ignore_errors=True)
                settle()
                times["direct"].append(s5(origin, "cp", f"s3://bench/{ds}/*", dst + "/"))
                shutil.rmtree(dst, ignore_errors=True)
                agent = Agent(work, origin, ttl, extra=extra)
                seen = (0, 0, 0)
                for phase in ("cold", "hot"):
                    settle()
                    times[phase].append(s5(agent.endpoint, "cp", f"s3://bench/{ds}/*", dst + "/"))
                    shutil.rmtree(dst, ignore_errors=True)
                    now = agent.fills()
                    req, blocks, dropped = (a - b for a, b in zip(now, seen))
                    seen = now
                    print(f"  {phase}: {req} origin requests filled {blocks} blocks; {dropped} disk writes dropped")
                peak, c = agent.stop()
                rss.append(peak)
                cpu.append(c)
                print(f"{ds} (metadata ttl {ttl} ms) round {r + 1}: direct {times['direct'][-1]:.2f} s, "
                      f"cold {times['cold'][-1]:.2f} s, hot {times['hot'][-1]:.2f} s, peak RSS {peak:.0f} MiB")
            med = {k: statistics.median(v) for k, v in times.items()}
            name = f"{ds}_ttl{ttl}"
            results[name] = {
                "direct_s": round(med["direct"], 3), "cold_s": round(med["cold"], 3), "hot_s": round(med["hot"], 3),
                "cold_over_direct": round(med["direct"] / med["cold"], 2),
                "hot_over_direct": round(med["direct"] / med["hot"], 2),
                "peak_rss_mib": round(max(rss)), "agent_cpu_s_median": round(statistics.median(cpu), 2),
            }
            print(f"  {name}: cold {results[name]['cold_over_direct']}x direct, hot {results[name]['hot_over_direct']}x "
                  f"direct (throughput ratios); peak RSS {max(rss):.0f} MiB "
                  f"(bound {RAM_MIB + INFLIGHT_MIB + 150} MiB)")

        if a.ttfb and a.large_mib >= 64:
            part = 50 << 20
            tkeys = [f"large/obj-{i:04}.bin" for i in range(min(4, a.large_mib // 64))]
            settle()
            direct = [first_byte(u, part) for u in presigned(origin, tkeys)]
            agent = Agent(work, origin, 60000, extra=extra)
            cold = [first_byte(u, part) for u in presigned(agent.endpoint, tkeys)]
            agent.stop()
            med = lambda v, i: statistics.median(x[i] for x in v) * 1e3
            results["ttfb_50mib"] = {"gateway_cold_first_ms": round(med(cold, 0), 1),
                                     "gateway_cold_all_ms": round(med(cold, 1), 1),
                                     "direct_first_ms": round(med(direct, 0), 1),
                                     "direct_all_ms": round(med(direct, 1), 1)}
            t = results["ttfb_50mib"]
            print(f"cold 50 MiB range, one client: gateway first byte {t['gateway_cold_first_ms']} ms, all "
                  f"{t['gateway_cold_all_ms']} ms; direct first byte {t['direct_first_ms']} ms, all "
                  f"{t['direct_all_ms']} ms (medians of {len(tkeys)})")

        # latency of one 16 KiB GET, hot gateway vs origin
        keys = [f"small/s-{i:06}.bin" for i in range(min(2000, a.small_count))]
        agent = Agent(work, origin, a.hot_ttl_ms, extra=extra)
        if a.pin_wrk:
            global PIN_WRK
            last = os.cpu_count() - 1
            if last < 1:
                raise SystemExit("--pin-wrk needs at least two CPUs")
            PIN_WRK = (f"0-{last - 1}" if last > 1 else "0", str(last))
            subprocess.run(["taskset", "-a", "-p", "-c", PIN_WRK[0], str(agent.proc.pid)], check=True,
                           stdout=subprocess.DEVNULL)
        gw_urls = presigned(agent.endpoint, keys)
        latencies(gw_urls, rounds=1)  # warm the cache
        gw = latencies(gw_urls)
        direct = latencies(presigned(origin, keys))
        results["latency_16k"] = {
            "gateway_hot_p50_ms": round(pct(gw, 0.5) * 1e3, 3), "gateway_hot_p99_ms": round(pct(gw, 0.99) * 1e3, 3),
            "direct_p50_ms": round(pct(direct, 0.5) * 1e3, 3), "direct_p99_ms": round(pct(direct, 0.99) * 1e3, 3),
        }
        print(f"16 KiB GET latency: gateway hot p50 {results['latency_16k']['gateway_hot_p50_ms']} ms / p99 "
              f"{results['latency_16k']['gateway_hot_p99_ms']} ms; direct p50 {results['latency_16k']['direct_p50_ms']} ms"
              f" / p99 {results['latency_16k']['direct_p99_ms']} ms")

        if not a.skip_nginx and shutil.which("nginx") and shutil.which("wrk"):
            nport = free_port()
            conf = os.path.join(work, "nginx.conf")
            with open(conf, "w") as f:
                f.write(f"""
user root;
worker_processes {len(os.sched_getaffinity(0)) if not PIN_WRK else os.cpu_count() - 1};
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 1000000;
  server {{ listen 127.0.0.1:{nport}; root {src}; }}
}}
""")
            subprocess.run((["taskset", "-c", PIN_WRK[0]] if PIN_WRK else []) + ["nginx", "-c", conf], check=True)
            try:
                wait_port(nport)
                large_keys = [f"large/obj-{i:04}.bin" for i in range(a.large_mib // 64)]
                gw_large = presigned(agent.endpoint, large_keys) if large_keys else []
                if large_keys:
                    s5(agent.endpoint, "cp", "s3://bench/large/*", os.path.join(work, "warm") + "/")
                shutil.rmtree(os.path.join(work, "warm"), ignore_errors=True)
                phases = [("small", gw_urls, keys)]
                if large_keys:
                    phases.insert(0, ("large", gw_large, large_keys))
                for name, urls_gw, keys_ in phases:
                    runs = []
                    for _ in range(a.wrk_rounds):
                        ng = wrk([f"http://127.0.0.1:{nport}/{k}" for k in keys_], work, f"nginx-{name}")
                        if name == "small":
                            # Hot means hot: the phases since the small keys were read took longer than a 60 s
                            # metadata TTL, and an expired key's first GET revalidates at the origin.
                            latencies(gw_urls, rounds=1)
                        g = wrk(urls_gw, work, f"gateway-{name}")
                        runs.append((g[0] / ng[0], ng, g))
                        print(f"wrk -c16 {name}: nginx {ng[0]:.0f} req/s {ng[1]:.0f} MiB/s, gateway hot {g[0]:.0f} "
                              f"req/s {g[1]:.0f} MiB/s -> {g[0] / ng[0]:.2f}x nginx")
                    runs.sort(key=lambda r: r[0])
                    _, ng, g = runs[len(runs) // 2]
                    results[f"nginx_{name}"] = {
                        "nginx_rps": ng[0], "nginx_mib_s": round(ng[1], 1), "gateway_rps": g[0],
                        "gateway_mib_s": round(g[1], 1), "gateway_over_nginx_rps": round(g[0] / ng[0], 2),
                        "gateway_over_nginx_mib_s": round(g[1] / ng[1], 2),
                        "ratios": [round(r[0], 2) for r in runs],
                    }
                    if a.wrk_rounds > 1:
                        print(f"wrk {name}: median {results[f'nginx_{name}']['gateway_over_nginx_rps']}x nginx over "
                              f"{a.wrk_rounds} rounds {results[f'nginx_{name}']['ratios']}")
            finally:
                subprocess.run(["nginx", "-c", conf, "-s", "stop"], check=False)
        peak, _ = agent.stop()
        results["peak_rss_mib_wrk_phase"] = round(peak)
        print(f"peak RSS during latency/wrk phase: {peak:.0f} MiB (bound {RAM_MIB + INFLIGHT_MIB + 150} MiB)")
        os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
        with open(os.path.join(ROOT, "bench", "out", "gateway_vs_direct.json"), "w") as f:
            json.dump(results, f, indent=2)
    finally:
        moto.terminate()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
