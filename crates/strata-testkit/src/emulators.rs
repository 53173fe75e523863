//! Cloud object-store emulators on loopback, as `object_store`'s own CI runs them: fake-gcs-server for Google
//! Cloud Storage and Azurite for Azure Blob Storage. Each is started on a free port for the life of the value
//! and killed on drop, with its data in a temporary directory.
//!
//! Where they are comes from the environment, `STRATA_FAKE_GCS` (the fake-gcs-server binary) and
//! `STRATA_AZURITE` (Azurite's `azurite-blob` script); the README's test command installs both under `.venv`
//! and sets them. Unset, [`FakeGcs::start`] and [`Azurite::start`] return `None` after a notice, and the test
//! skips, unless `STRATA_REQUIRE_EMULATORS=1` (the test command sets it), which makes it a failure.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;

/// The environment variable naming the fake-gcs-server binary.
pub const FAKE_GCS_ENV: &str = "STRATA_FAKE_GCS";
/// The environment variable naming Azurite's `azurite-blob`.
pub const AZURITE_ENV: &str = "STRATA_AZURITE";
/// Set to `1`, a missing emulator fails the test instead of skipping it.
pub const REQUIRE_EMULATORS_ENV: &str = "STRATA_REQUIRE_EMULATORS";

/// The binary `var` names, or `None` (after a notice on stderr, which tests do not capture) when it is unset.
/// Panics instead when `STRATA_REQUIRE_EMULATORS=1`.
fn emulator_binary(var: &str, what: &str) -> Option<PathBuf> {
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var(REQUIRE_EMULATORS_ENV).as_deref() == Ok("1") => panic!(
            "{REQUIRE_EMULATORS_ENV}=1 but {var} is not set: it must name {what} \
             (scripts/test.sh installs it under .venv and sets it)"
        ),
        None => {
            // Straight to the stream, past the test harness's capture: a skip must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {var} is not set (the path of {what}); scripts/test.sh installs it and sets it. \
                 {REQUIRE_EMULATORS_ENV}=1 makes this a failure."
            );
            None
        }
    }
}

/// Start `cmd`, then wait until `port` on loopback accepts connections (30 s at most).
fn spawn_listening(mut cmd: Command, what: &str, bin: &std::path::Path, port: u16) -> Child {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what} ({}): {e}", bin.display()));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} ({}) exited early with {status}", bin.display());
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return child;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not listen on port {port} within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// fake-gcs-server (plain HTTP, in-memory) on loopback, killed on drop.
#[derive(Debug)]
pub struct FakeGcs {
    child: Child,
    port: u16,
    /// For the requests made here (one client: connections are reused, as a thousand uploads need).
    client: reqwest::Client,
}

impl FakeGcs {
    /// Start the server named by `STRATA_FAKE_GCS` and wait until it answers; `None` when that is unset (see
    /// the module notes).
    pub fn start() -> Option<Self> {
        let bin = emulator_binary(FAKE_GCS_ENV, "the fake-gcs-server binary")?;
        let port = crate::free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(&bin);
        cmd.args([
            "-scheme",
            "http",
            "-backend",
            "memory",
            "-host",
            "127.0.0.1",
        ])
        .args(["-port", &port.to_string()])
        // Requests name this host (XML-style `/bucket/object` routes match on it) and uploads are
        // resumed at this URL.
        .args(["-public-host", &addr])
        .args(["-external-url", &format!("http://{addr}")])
        .args(["-log-level", "error"]);
        let child = spawn_listening(cmd, "fake-gcs-server", &bin, port);
        let server = Self {
            child,
            port,
            client: reqwest::Client::new(),
        };
        server.wait_answering();
        Some(server)
    }

    /// Until `GET /storage/v1/b` answers 200 (the port may be bound before the API is up).
    fn wait_answering(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !http_get_ok(self.port, "/storage/v1/b") {
            assert!(
                Instant::now() < deadline,
                "fake-gcs-server on port {} did not answer GET /storage/v1/b within 30 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A service account key (JSON, for `GOOGLE_SERVICE_ACCOUNT_KEY`) that points `object_store`'s GCS client
    /// at this server, without OAuth.
    pub fn service_account_key(&self) -> String {
        format!(
            r#"{{"gcs_base_url": "{}", "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}}"#,
            self.endpoint()
        )
    }

    /// Write an object through the server's JSON API (`uploadType=media`). The server takes no writes through
    /// the XML API, which `object_store`'s GCS client writes with (fsouza/fake-gcs-server#331): objects a GCS
    /// backend is to read there are put this way.
    pub async fn upload(&self, bucket: &str, name: &str, data: Bytes) {
        let r = self
            .client
            .post(format!(
                "{}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={}",
                self.endpoint(),
                query_escape(name)
            ))
            .header("content-type", "application/octet-stream")
            .body(data)
            .send()
            .await
            .expect("uploading to fake-gcs-server");
        let status = r.status();
        assert!(
            status.is_success(),
            "uploading {name} to fake-gcs-server: HTTP {status}: {}",
            r.text().await.unwrap_or_default()
        );
    }

    /// Create a bucket (idempotent).
    pub async fn create_bucket(&self, name: &str) {
        let r = self
            .client
            .post(format!("{}/storage/v1/b", self.endpoint()))
            .header("content-type", "application/json")
            .body(format!(r#"{{"name": "{name}"}}"#))
            .send()
            .await
            .expect("creating a bucket on fake-gcs-server");
        assert!(
            r.status().is_success() || r.status().as_u16() == 409,
            "creating bucket {name} on fake-gcs-server: HTTP {}",
            r.status()
        );
    }
}

impl Drop for FakeGcs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Azurite's Blob service on loopback, its data in a temporary directory; killed on drop.
#[derive(Debug)]
pub struct Azurite {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Azurite {
    /// The account every Azurite serves.
    pub const ACCOUNT: &str = "devstoreaccount1";
    /// Its well-known key (published by Microsoft; the same in every Azurite).
    pub const ACCOUNT_KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

    /// Start the `azurite-blob` named by `STRATA_AZURITE` and wait until it listens; `None` when that is unset
    /// (see the module notes). It runs on the `node` found on `PATH`.
    pub fn start() -> Option<Self> {
        let bin = emulator_binary(AZURITE_ENV, "Azurite's azurite-blob")?;
        let dir = tempfile::tempdir().expect("a temporary directory for Azurite");
        let port = crate::free_port();
        let mut cmd = Command::new(&bin);
        cmd.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .arg("--location")
            .arg(dir.path())
            .current_dir(dir.path())
            // Any API version object_store sends; headers it does not implement ignored, not refused.
            .args(["--skipApiVersionCheck", "--loose", "--silent"])
            // Nothing leaves the machine (by default it sends usage data to Microsoft).
            .arg("--disableTelemetry");
        let child = spawn_listening(cmd, "Azurite", &bin, port);
        Some(Self {
            child,
            port,
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:PORT`: what `object_store` takes as `AZURITE_BLOB_STORAGE_URL` (the account is the
    /// first segment of the path).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Create a container (idempotent), with a request signed by the account key (Shared Key).
    pub async fn create_container(&self, name: &str) {
        let path = format!("/{}/{name}", Self::ACCOUNT);
        let date = http_date(SystemTime::now());
        let version = "2023-11-03";
        // https://learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key: the verb, eleven
        // standard headers (all empty here, Content-Length 0 included), the x-ms- headers, the resource.
        let to_sign = format!(
            "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{}{path}\nrestype:container",
            Self::ACCOUNT
        );
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = b64
            .decode(Self::ACCOUNT_KEY)
            .expect("the emulator key is base64");
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
        let signature = b64.encode(ring::hmac::sign(&key, to_sign.as_bytes()).as_ref());
        let r = reqwest::Client::new()
            .put(format!("{}{path}?restype=container", self.endpoint()))
            .header("x-ms-date", &date)
            .header("x-ms-version", version)
            .header("content-length", "0")
            .header(
                "authorization",
                format!("SharedKey {}:{signature}", Self::ACCOUNT),
            )
            .send()
            .await
            .expect("creating a container on Azurite");
        let status = r.status();
        assert!(
            status.is_success() || status.as_u16() == 409,
            "creating container {name} on Azurite: HTTP {status}: {}",
            r.text().await.unwrap_or_default()
        );
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        // SIGKILL: on SIGTERM Azurite takes its time shutting down.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `s` as a query string value: every byte but the unreserved ones percent-encoded.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Whether `GET path` on loopback `port` answers 200 (one blocking HTTP/1.0 exchange).
fn http_get_ok(port: u16, path: &str) -> bool {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

/// An HTTP date (RFC 7231 IMF-fixdate), e.g. `Tue, 01 Dec 2026 20:41:03 GMT`.
fn http_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(query_escape("odd/a#x b%3~4"), "odd%2Fa%23x%20b%253~4");
        assert_eq!(query_escape("é"), "%C3%A9");
    }

    #[test]
    fn http_dates() {
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            http_date(UNIX_EPOCH + Duration::from_secs(1_709_251_199)),
            "Thu, 29 Feb 2024 23:59:59 GMT"
        );
        assert_eq!(
            http_date(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "Tue, 29 Feb 2000 00:00:00 GMT"
        );
    }
}
