use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A moto S3 server on loopback, killed on drop.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    port: u16,
}

/// Credentials moto accepts (it accepts any; these are what tests configure).
pub const ACCESS_KEY: &str = "strata-test";
/// See [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "strata-test-secret";

impl S3Server {
    fn binary() -> PathBuf {
        if let Ok(p) = std::env::var("STRATA_MOTO_SERVER") {
            return PathBuf::from(p);
        }
        let venv = crate::workspace_root().join(".venv/bin/moto_server");
        if venv.exists() {
            return venv;
        }
        PathBuf::from("moto_server")
    }

    /// Start a server and wait until it answers. Panics with instructions when moto is not installed.
    pub fn start() -> Self {
        let port = crate::free_port();
        let bin = Self::binary();
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start the S3 test server {}: {e}. Run the README's test command \
                     (scripts/test.sh), which installs moto into .venv, or set STRATA_MOTO_SERVER.",
                    bin.display()
                )
            });
        let mut server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("S3 test server exited early with {status}");
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                let _ = server.child.kill();
                panic!("S3 test server did not listen on port {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        server.port = port;
        server
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Create a bucket (idempotent).
    pub async fn create_bucket(&self, name: &str) {
        create_bucket_at(&self.endpoint(), name).await;
    }
}

/// Create `name` at an S3 endpoint (moto accepts unsigned requests).
pub async fn create_bucket_at(endpoint: &str, name: &str) {
    let client = reqwest::Client::new();
    let r = client
        .put(format!("{endpoint}/{name}"))
        .send()
        .await
        .expect("creating a bucket on the test S3 server");
    assert!(
        r.status().is_success() || r.status().as_u16() == 409,
        "creating bucket {name}: HTTP {}",
        r.status()
    );
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
