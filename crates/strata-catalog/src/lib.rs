//! Strata's metadata catalog.
//!
//! One schema, one set of queries, two databases: SQLite embedded in the data dir (the default) and PostgreSQL
//! (a multi-node control plane). Everything goes through `sqlx`'s `Any` driver with portable SQL: `BIGINT` and
//! `TEXT` columns, application-generated ids, `ON CONFLICT` upserts, `$N` placeholders (SQLite accepts them too).
//!
//! What lives here:
//! - [`access`]: teams, principals (bearer tokens, S3 access keys), roles, and the audit log;
//! - [`quota`]: limits and counters per team and scope, and the reservation protocol that admits a write
//!   *before* its bytes are accepted;
//! - [`inventory`]: the objects Strata knows of (written through it or found by reconciliation), prefix
//!   ownership, access times, usage grouped by team, prefix, job or dataset;
//! - [`lifecycle`]: retention policies, protections (pins and claims), clean-up plans and their trash records,
//!   scratch allocations, usage samples for forecasts.
//!
//! Time comes from a [`Clock`], so tests can move it (grace periods, TTLs, expiry).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyPool, Executor};
use strata_types::{Error, ErrorKind, Result};

pub mod access;
pub mod buckets;
pub mod claims;
pub mod fleet;
pub mod inventory;
pub mod lifecycle;
pub mod members;
pub mod quota;
pub mod secrets;
pub mod wire;

pub use access::{Principal, Role};

/// Seconds since the Unix epoch, from a replaceable source.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in unix seconds.
    fn now(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to (tests: grace periods, expiry).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock reading `now`.
    pub fn new(now: i64) -> Self {
        Self(AtomicI64::new(now))
    }
    /// Move the clock forward by `secs`.
    pub fn advance(&self, secs: i64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
    /// Set the clock.
    pub fn set(&self, now: i64) {
        self.0.store(now, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Which database a catalog runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Embedded SQLite file.
    Sqlite,
    /// PostgreSQL server.
    Postgres,
}

/// A handle on the catalog; cheap to clone.
#[derive(Debug, Clone)]
pub struct Catalog {
    pool: AnyPool,
    dialect: Dialect,
    clock: Arc<dyn Clock>,
    /// The agent whose reservations this handle admits ([`Catalog::with_holder`]).
    holder: Option<Arc<str>>,
    /// The key S3 secrets are sealed with ([`Catalog::with_key`]).
    key: Option<Arc<secrets::CatalogKey>>,
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

impl Catalog {
    /// Open (creating if needed) the catalog at `url` and run pending migrations.
    ///
    /// `url` is `sqlite:///abs/path/catalog.db` (or `sqlite://relative.db`) or `postgres://user@host:port/db`.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with_clock(url, Arc::new(SystemClock)).await
    }

    /// Like [`Catalog::open`] with a chosen clock.
    pub async fn open_with_clock(url: &str, clock: Arc<dyn Clock>) -> Result<Self> {
        install_default_drivers();
        let (dialect, url) = if let Some(rest) = url.strip_prefix("sqlite://") {
            let path = rest.split('?').next().unwrap_or(rest);
            if path.is_empty() {
                return Err(Error::config("catalog URL sqlite:// needs a file path"));
            }
            if let Some(parent) = std::path::Path::new(path).parent()
                && !parent.as_os_str().is_empty()
            {
                std::fs::create_dir_all(parent)
                    .map_err(|e| Error::from_io(e, format!("creating {}", parent.display())))?;
            }
            let url = if rest.contains('?') {
                url.to_string()
            } else {
                format!("{url}?mode=rwc")
            };
            (Dialect::Sqlite, url)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Dialect::Postgres, url.to_string())
        } else {
            return Err(Error::config(format!(
                "catalog URL {url:?}: expected sqlite:///path or postgres://..."
            )));
        };
        let mut opts = AnyPoolOptions::new()
            .max_connections(if dialect == Dialect::Sqlite { 8 } else { 16 })
            .acquire_timeout(Duration::from_secs(30));
        if dialect == Dialect::Sqlite {
            opts = opts.after_connect(|conn, _meta| {
                Box::pin(async move {
                    conn.execute("PRAGMA busy_timeout = 30000").await?;
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    conn.execute("PRAGMA synchronous = NORMAL").await?;
                    conn.execute("PRAGMA foreign_keys = ON").await?;
                    Ok(())
                })
            });
        }
        let pool = opts
            .connect(&url)
            .await
            .map_err(|e| db_err(e).context(format!("opening catalog {}", redact(&url))))?;
        MIGRATOR.run(&pool).await.map_err(|e| {
            Error::new(ErrorKind::Internal, format!("migrating the catalog: {e}")).with_source(e)
        })?;
        Ok(Self {
            pool,
            dialect,
            clock,
            holder: None,
            key: None,
        })
    }

    /// This handle's reservations are held by `holder` (an agent's stable id): [`Catalog::release_held`]
    /// gives them back when that agent starts again.
    pub fn with_holder(mut self, holder: &str) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// The database behind this catalog.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The clock this catalog stamps times with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Now, by this catalog's clock.
    pub fn now(&self) -> i64 {
        self.clock.now()
    }

    /// Close the pool (waits for connections to be returned).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }
}

/// Drop the password from a URL before it goes into a message.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Map a database error to Strata's error kinds.
pub(crate) fn db_err(e: sqlx::Error) -> Error {
    let kind = match &e {
        sqlx::Error::RowNotFound => ErrorKind::NotFound,
        sqlx::Error::Database(d) if d.is_unique_violation() => ErrorKind::AlreadyExists,
        sqlx::Error::Database(d) if d.is_check_violation() || d.is_foreign_key_violation() => {
            ErrorKind::InvalidInput
        }
        sqlx::Error::Database(d) => {
            // SQLite BUSY/LOCKED and PostgreSQL serialization failures and deadlocks are transient.
            let code = d.code().map(|c| c.into_owned()).unwrap_or_default();
            if matches!(code.as_str(), "5" | "6" | "40001" | "40P01") {
                ErrorKind::Unavailable
            } else {
                ErrorKind::Internal
            }
        }
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            ErrorKind::Unavailable
        }
        sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => ErrorKind::Unavailable,
        sqlx::Error::Configuration(_) => ErrorKind::Config,
        _ => ErrorKind::Internal,
    };
    Error::new(kind, format!("catalog: {e}")).with_source(e)
}

/// A random id: `prefix` + 16 lowercase base32 characters (80 bits).
pub fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut s = String::with_capacity(prefix.len() + 16);
    s.push_str(prefix);
    for _ in 0..16 {
        s.push(ALPHABET[rand::random_range(0..32usize)] as char);
    }
    s
}

/// Validate a team name: 1..=63 of `[a-z0-9._-]`, starting with a letter or digit.
pub fn validate_team_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_input(format!(
            "team name {name:?}: use 1 to 63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit"
        )))
    }
}

/// Normalize an ownership or policy prefix: no leading '/', ends with '/', no empty, `.` or `..` segment, no
/// `*` (prefixes are literal; "everything" is the empty prefix, which callers must ask for explicitly).
pub fn normalize_prefix(prefix: &str) -> Result<String> {
    let p = prefix.trim_start_matches('/');
    if p.is_empty() {
        return Err(Error::invalid_input(
            "empty prefix: name the prefix explicitly (a whole backend is not a valid pattern)",
        ));
    }
    if p.contains('*') || p.contains('\0') {
        return Err(Error::invalid_input(format!(
            "prefix {prefix:?}: wildcards and NUL are not allowed; prefixes are literal"
        )));
    }
    let p = p.trim_end_matches('/');
    if p.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(Error::invalid_input(format!(
            "prefix {prefix:?}: empty, '.' or '..' segment"
        )));
    }
    Ok(format!("{p}/"))
}

/// Whether `key` lies under the normalized `prefix` (segment-aware: `team-a/` does not cover `team-ab/x`).
pub fn key_under(key: &str, prefix: &str) -> bool {
    debug_assert!(prefix.ends_with('/'));
    key.starts_with(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_segment_aware_and_literal() {
        assert_eq!(normalize_prefix("team-a").unwrap(), "team-a/");
        assert_eq!(normalize_prefix("/team-a/x/").unwrap(), "team-a/x/");
        assert!(key_under("team-a/k", &normalize_prefix("team-a").unwrap()));
        assert!(!key_under(
            "team-ab/k",
            &normalize_prefix("team-a").unwrap()
        ));
        for bad in ["", "/", "*", "a/*", "a//b", "a/../b", "./a"] {
            assert!(normalize_prefix(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }
}

/// Helpers for tests in this and other crates: a fresh catalog on every database the environment offers.
#[doc(hidden)]
pub mod testing {
    use super::*;

    /// The PostgreSQL server tests use (`STRATA_TEST_POSTGRES_URL`, e.g.
    /// `postgres://postgres@127.0.0.1:55432/postgres`). When `STRATA_REQUIRE_POSTGRES=1` (the test command sets
    /// it), a missing server is a failure, not a skip.
    pub fn postgres_url() -> Option<String> {
        let url = std::env::var("STRATA_TEST_POSTGRES_URL")
            .ok()
            .filter(|u| !u.is_empty());
        if url.is_none() && std::env::var("STRATA_REQUIRE_POSTGRES").as_deref() == Ok("1") {
            panic!("STRATA_REQUIRE_POSTGRES=1 but STRATA_TEST_POSTGRES_URL is not set");
        }
        url
    }

    /// Create a fresh, empty PostgreSQL database on the server of `admin_url`; returns its URL.
    pub async fn fresh_postgres(admin_url: &str) -> Result<String> {
        install_default_drivers();
        let name = new_id("strata_test_");
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(admin_url)
            .await
            .map_err(db_err)?;
        pool.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .map_err(db_err)?;
        pool.close().await;
        let base = admin_url
            .rsplit_once('/')
            .map(|(b, _)| b)
            .unwrap_or(admin_url);
        Ok(format!("{base}/{name}"))
    }

    /// A fresh catalog on SQLite (in `dir`) and, when configured, one on PostgreSQL.
    pub async fn catalogs(dir: &std::path::Path, clock: Arc<dyn Clock>) -> Vec<Catalog> {
        let mut out = Vec::new();
        let sqlite = format!("sqlite://{}/catalog-{}.db", dir.display(), new_id(""));
        out.push(
            Catalog::open_with_clock(&sqlite, clock.clone())
                .await
                .expect("open sqlite catalog")
                .with_key(crate::secrets::CatalogKey::generate().expect("a key"))
                .await
                .expect("key the catalog"),
        );
        if let Some(admin) = postgres_url() {
            let url = fresh_postgres(&admin)
                .await
                .expect("create a postgres test database");
            out.push(
                Catalog::open_with_clock(&url, clock)
                    .await
                    .expect("open postgres catalog")
                    .with_key(crate::secrets::CatalogKey::generate().expect("a key"))
                    .await
                    .expect("key the catalog"),
            );
        }
        out
    }
}
