//! End-to-end tests of the `strata` binary: embedded defaults, the control API, the CLI, signals, a SIGKILL
//! during fills, and bad configuration. The S3 origin is a real S3 server (moto) on loopback.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use strata_testkit::{ACCESS_KEY, S3Server, SECRET_KEY};

const BIN: &str = env!("CARGO_BIN_EXE_strata");
/// The administrator token every agent of these tests is started with (STRATA_ADMIN_TOKEN).
const TOKEN: &str = "e2e-admin-token-0123456789";

struct Agent {
    child: Child,
    api: String,
    dir: PathBuf,
}

impl Agent {
    fn start(dir: &Path, extra: &[&str]) -> Agent {
        let _ = std::fs::remove_file(dir.join(".strata/api.addr"));
        let child = Command::new(BIN)
            .env("STRATA_TOKEN", TOKEN)
            .env("STRATA_ADMIN_TOKEN", TOKEN)
            .current_dir(dir)
            .args([
                "serve",
                "--api-listen",
                "127.0.0.1:0",
                "--s3-listen",
                "127.0.0.1:0",
            ])
            .args(extra)
            .env("STRATA_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning strata serve");
        let addr_file = dir.join(".strata/api.addr");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut child = child;
        loop {
            if let Ok(s) = std::fs::read_to_string(&addr_file)
                && !s.trim().is_empty()
            {
                return Agent {
                    child,
                    api: s.trim().to_string(),
                    dir: dir.to_path_buf(),
                };
            }
            if let Ok(Some(status)) = child.try_wait() {
                let out = child.wait_with_output().unwrap();
                panic!(
                    "strata serve exited with {status}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            assert!(Instant::now() < deadline, "strata serve did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn get(&self, path: &str) -> reqwest::blocking_like::Response {
        reqwest::blocking_like::get(&format!("{}{path}", self.api))
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .env("STRATA_TOKEN", TOKEN)
            .env("STRATA_ADMIN_TOKEN", TOKEN)
            .current_dir(&self.dir)
            .args(args)
            .env("STRATA_API", &self.api)
            .output()
            .expect("running strata")
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tiny blocking HTTP helper over reqwest's async client (the tests are synchronous).
mod reqwest {
    pub mod blocking_like {
        pub struct Response {
            pub status: u16,
            pub body: Vec<u8>,
        }
        impl Response {
            pub fn text(&self) -> String {
                String::from_utf8_lossy(&self.body).into_owned()
            }
            pub fn json(&self) -> serde_json::Value {
                serde_json::from_slice(&self.body).expect("JSON body")
            }
        }
        fn rt() -> tokio::runtime::Runtime {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        }
        pub fn get(url: &str) -> Response {
            request(::reqwest::Method::GET, url, None, &[])
        }
        pub fn request(
            method: ::reqwest::Method,
            url: &str,
            body: Option<serde_json::Value>,
            headers: &[(&str, &str)],
        ) -> Response {
            rt().block_on(async {
                let mut r = ::reqwest::Client::new()
                    .request(method, url)
                    .bearer_auth(super::super::TOKEN);
                for (k, v) in headers {
                    r = r.header(*k, *v);
                }
                if let Some(b) = body {
                    r = r.json(&b);
                }
                let resp = r.send().await.expect("request");
                let status = resp.status().as_u16();
                let body = resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
                Response { status, body }
            })
        }
    }
}

fn blake3_hex(b: &[u8]) -> String {
    blake3::hash(b).to_hex().to_string()
}

#[test]
fn serves_on_embedded_defaults_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), &[]);
    let h = agent.get("/healthz");
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");

    // the default backend is a local directory under the data dir
    let objects = dir.path().join(".strata/objects/datasets");
    std::fs::create_dir_all(&objects).unwrap();
    let data: Vec<u8> = (0..20_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(objects.join("shard-0.bin"), &data).unwrap();
    let r = agent.get("/v1/read?location=default/datasets/shard-0.bin");
    assert_eq!(r.status, 200);
    assert_eq!(
        blake3_hex(&r.body),
        blake3_hex(&data),
        "cold read is byte-exact"
    );
    let r = agent.get("/v1/read?location=default/datasets/shard-0.bin");
    assert_eq!(
        blake3_hex(&r.body),
        blake3_hex(&data),
        "hot read is byte-exact"
    );
    let r = reqwest::blocking_like::request(
        ::reqwest::Method::GET,
        &format!(
            "{}/v1/read?location=default/datasets/shard-0.bin",
            agent.api
        ),
        None,
        &[("range", "bytes=8388600-8388700")],
    );
    assert_eq!(r.status, 206);
    assert_eq!(
        r.body,
        data[8_388_600..=8_388_700].to_vec(),
        "a range across a block boundary"
    );

    // stats and metrics
    let s = agent.get("/v1/cache").json();
    assert!(s["ram"]["hits"].as_u64().unwrap() >= 3, "{s}");
    assert_eq!(s["block_size"], 8 * 1024 * 1024);
    let m = agent.get("/metrics").text();
    for family in [
        "strata_io_requests_total",
        "strata_io_bytes_total",
        "strata_io_latency_seconds_bucket",
        "strata_cache_hits_total{tier=\"ram\"}",
        "strata_cache_misses_total",
        "strata_cache_evictions_total",
        "strata_cache_checksum_failures_total",
        "strata_backend_errors_total",
        "strata_backend_retries_total",
        "strata_cache_used_bytes{tier=\"disk\"}",
    ] {
        assert!(m.contains(family), "metrics lack {family}");
    }

    // bad input is a clear 4xx, and the canary next to the backend root is never read
    std::fs::write(dir.path().join(".strata/canary"), b"do not read").unwrap();
    for bad in [
        "default/../canary",
        "default/%2e%2e/canary",
        "file:///etc/passwd",
        "nosuch/key",
        "default/missing.bin",
    ] {
        let r = agent.get(&format!("/v1/read?location={bad}"));
        assert!((400..500).contains(&r.status), "{bad}: {}", r.status);
        assert!(r.json()["message"].as_str().is_some());
        assert!(!r.text().contains("do not read"));
    }

    // a second agent on the same data dir is refused
    let out = Command::new(BIN)
        .env("STRATA_TOKEN", TOKEN)
        .env("STRATA_ADMIN_TOKEN", TOKEN)
        .current_dir(dir.path())
        .args([
            "serve",
            "--api-listen",
            "127.0.0.1:0",
            "--s3-listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another strata agent"));

    // the CLI against the running agent
    let out = agent.cli(&["cache", "stats"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("hit ratio") && text.contains("disk"),
        "{text}"
    );
    // make sure every block is on disk (ordinary reads cache on disk lossily), then pin
    let out = agent.cli(&["cache", "warm", "default/datasets/", "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = agent.cli(&["cache", "pin", "default/datasets/"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 cached blocks pinned"));
    let out = agent.cli(&["cache", "unpin", "default/datasets/"]);
    assert!(out.status.success());
    let out = agent.cli(&["cache", "unpin", "default/datasets/"]);
    assert_eq!(out.status.code(), Some(2), "unpinning twice is an error");

    let dirp = dir.path().to_path_buf();
    let status = agent.terminate();
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    assert!(!dirp.join(".strata/api.addr").exists());
    assert_eq!(
        std::fs::read_dir(dirp.join(".strata/cache/tmp"))
            .unwrap()
            .count(),
        0
    );
}

fn s3_config(dir: &Path, endpoint: &str, extra_cache: &str) -> PathBuf {
    let cfg = format!(
        r#"
[cache]
block_size = "1MiB"
ram_capacity = "8MiB"
disk_capacity = "256MiB"
{extra_cache}

[retry]
max_retries = 3
initial_backoff = 10
max_backoff = 100

[[backends]]
name = "origin"
url = "s3://e2e"
[backends.options]
endpoint = "{endpoint}"
access_key_id = "{ACCESS_KEY}"
secret_access_key = "{SECRET_KEY}"
"#
    );
    let p = dir.join("strata.toml");
    std::fs::write(&p, cfg).unwrap();
    p
}

fn put_objects(endpoint: &str, n: usize, size: usize) -> Vec<(String, String)> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            strata_testkit::create_bucket_at(endpoint, "e2e").await;
            let o = strata_object::BackendOptions {
                endpoint: Some(endpoint.into()),
                access_key_id: Some(ACCESS_KEY.into()),
                secret_access_key: Some(SECRET_KEY.into()),
                ..Default::default()
            };
            let b = strata_object::Backend::open(
                "s3://e2e",
                &o,
                strata_object::RetryPolicy::default(),
                strata_telemetry::Telemetry::new(),
            )
            .unwrap();
            let mut out = Vec::new();
            for i in 0..n {
                let data: Vec<u8> = (0..size)
                    .map(|j| ((i * 7919 + j * 31) % 251) as u8)
                    .collect();
                let key = format!("train/shard-{i:03}.bin");
                b.put(
                    &Default::default(),
                    &key,
                    data.clone().into(),
                    strata_object::PutMode::Overwrite,
                )
                .await
                .unwrap();
                out.push((key, blake3_hex(&data)));
            }
            out
        })
}

#[test]
fn sigkill_during_fills_then_restart_serves_correct_bytes() {
    let server = S3Server::start();
    let objects = put_objects(&server.endpoint(), 24, 3 * 1024 * 1024 + 12_345);
    let dir = tempfile::tempdir().unwrap();
    let cfg = s3_config(dir.path(), &server.endpoint(), "");
    let cfg_s = cfg.display().to_string();
    let agent = Agent::start(dir.path(), &["--config", &cfg_s]);

    // start a warm-up through the CLI and kill the agent while blocks are being filled
    let mut warm = Command::new(BIN)
        .env("STRATA_TOKEN", TOKEN)
        .env("STRATA_ADMIN_TOKEN", TOKEN)
        .current_dir(dir.path())
        .args([
            "cache",
            "warm",
            "origin/train/",
            "--concurrency",
            "4",
            "--quiet",
        ])
        .env("STRATA_API", &agent.api)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Blocks on disk, not fills: a fill is counted before its block file is written, so under load
        // the kill could land with fewer blocks written than fills counted.
        let s = agent.get("/v1/cache").json();
        if s["disk"]["blocks"].as_u64().unwrap_or(0) >= 10 {
            break;
        }
        assert!(Instant::now() < deadline, "warm-up made no progress: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
    agent.kill();
    let st = warm.wait().unwrap();
    assert!(!st.success(), "the interrupted warm-up reports failure");

    // restart: the disk index is rebuilt, partial files removed, and every byte read is right
    let agent = Agent::start(dir.path(), &["--config", &cfg_s]);
    let s = agent.get("/v1/cache").json();
    let blocks_after_restart = s["disk"]["blocks"].as_u64().unwrap();
    assert!(
        blocks_after_restart >= 5,
        "blocks written before the kill survive: {s}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join(".strata/cache/tmp"))
            .unwrap()
            .count(),
        0
    );
    for (key, hash) in &objects {
        let r = agent.get(&format!("/v1/read?location=origin/{key}"));
        assert_eq!(r.status, 200);
        assert_eq!(&blake3_hex(&r.body), hash, "{key}");
    }
    let s = agent.get("/v1/cache").json();
    assert!(
        s["disk"]["hits"].as_u64().unwrap() >= blocks_after_restart.min(1),
        "{s}"
    );
    assert_eq!(s["disk_faults"]["checksum_failures"], 0);

    // warm the rest: everything ends up cached
    let out = agent.cli(&["cache", "warm", "origin/train/", "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["objects"], 24);
    assert_eq!(v["failed_blocks"], 0);
    assert_eq!(
        v["done_bytes"].as_u64().unwrap(),
        24 * (3 * 1024 * 1024 + 12_345)
    );
    assert!(agent.terminate().success());
}

#[test]
fn bad_configuration_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[cache]\nram_capacity = 0\n", "ram_capacity"),
        (
            "[cache]\ndisk_capacity = \"5000TiB\"\n",
            "larger than the file system",
        ),
        (
            "[[backends]]\nname = \"x\"\nurl = \"gopher://x\"\n",
            "must start with",
        ),
        ("[cache\n", "test.toml"),
        (
            "[cache]\nblock_size = \"8 furlongs\"\n",
            "invalid byte size",
        ),
    ];
    for (text, want) in cases {
        let p = dir.path().join("test.toml");
        std::fs::write(&p, text).unwrap();
        for args in [
            vec!["config", "check"],
            vec![
                "serve",
                "--api-listen",
                "127.0.0.1:0",
                "--s3-listen",
                "127.0.0.1:0",
                "--config",
            ],
        ] {
            let out = Command::new(BIN)
                .env("STRATA_TOKEN", TOKEN)
                .env("STRATA_ADMIN_TOKEN", TOKEN)
                .current_dir(dir.path())
                .args(&args)
                .arg(&p)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{text:?} {args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
    let out = Command::new(BIN)
        .env("STRATA_TOKEN", TOKEN)
        .env("STRATA_ADMIN_TOKEN", TOKEN)
        .args(["config", "check", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.toml"));
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[cache]\nram_capacity = \"64MiB\"\ndisk_enabled = false\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .env("STRATA_TOKEN", TOKEN)
        .env("STRATA_ADMIN_TOKEN", TOKEN)
        .args(["config", "check"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("cache.disk      off"));
}

#[test]
fn help_explains_the_commands() {
    let out = Command::new(BIN)
        .env("STRATA_TOKEN", TOKEN)
        .env("STRATA_ADMIN_TOKEN", TOKEN)
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["serve", "cache", "config"] {
        assert!(text.contains(cmd), "{text}");
    }
    let out = Command::new(BIN)
        .env("STRATA_TOKEN", TOKEN)
        .env("STRATA_ADMIN_TOKEN", TOKEN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("embedded defaults")
            && text.contains("--data-dir")
            && text.contains("--api-listen")
    );
    let out = Command::new(BIN)
        .env("STRATA_TOKEN", TOKEN)
        .env("STRATA_ADMIN_TOKEN", TOKEN)
        .args(["cache", "warm", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--concurrency"));
}

#[test]
fn a_killed_agent_releases_its_reservations_when_it_starts_again() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(dir.path(), &[]);
    let post = |a: &Agent, path: &str, body: serde_json::Value| {
        reqwest::blocking_like::request(
            ::reqwest::Method::POST,
            &format!("{}{path}", a.api),
            Some(body),
            &[],
        )
    };
    let put = |a: &Agent, path: &str, body: serde_json::Value| {
        reqwest::blocking_like::request(
            ::reqwest::Method::PUT,
            &format!("{}{path}", a.api),
            Some(body),
            &[],
        )
    };
    assert_eq!(
        post(&agent, "/v1/teams", serde_json::json!({"name": "t"})).status,
        200
    );
    assert_eq!(
        put(
            &agent,
            "/v1/quotas/t/default",
            serde_json::json!({"hard_bytes": 100})
        )
        .status,
        200
    );
    // A writer admitted for 90 of 100 bytes; the agent is killed before the write commits.
    let r = post(
        &agent,
        "/v1/quotas/t/default/reserve",
        serde_json::json!({"bytes": 90}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let refused = post(
        &agent,
        "/v1/quotas/t/default/reserve",
        serde_json::json!({"bytes": 20}),
    );
    assert_eq!(refused.status, 429, "{}", refused.text());
    agent.kill();
    // Started again on its data directory, it gives back what it held (not a day later).
    let agent = Agent::start(dir.path(), &[]);
    let q = agent.get("/v1/quotas/t").json();
    let row = q
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["scope"] == "default")
        .cloned()
        .unwrap();
    assert_eq!(row["reserved_bytes"], 0, "{q}");
    let again = post(
        &agent,
        "/v1/quotas/t/default/reserve",
        serde_json::json!({"bytes": 20}),
    );
    assert_eq!(again.status, 200, "{}", again.text());
    agent.terminate();
}
