//! Locations → the backend, its name in the catalog (what ownership and quotas are keyed by) and the key.
//!
//! A location is `NAME/key` (a configured backend), a URL under a configured backend's URL as configured, or
//! any other S3 URL (`s3://`, `s3a://`, `s3n://`). Access is decided on the store a URL reaches, never on its
//! spelling ([`StoreLocation`]: the endpoint, the bucket, the key): an S3 URL that lands inside a configured
//! backend is that backend (`s3://b/pre/k` for a backend configured as `s3a://b/pre` is its key `k`), one that
//! lands inside the S3 `[gateway] bucket_root` is the created bucket it names, and one that would cover either
//! from above (the bucket around a configured prefix, the root prefix itself) is refused: its listing or
//! warm-up would reach data that only the configured name's owners decide on. Everything else is an ad-hoc
//! bucket, opened with `[s3_defaults]`, which belongs to no team.

use strata_object::{Backend, BackendOptions, Relation, StoreLocation};
use strata_types::{Error, ErrorKind, Result};

use crate::{Agent, Resolved};

/// Most ad-hoc backends (URLs that match no configured backend) kept open at once.
const MAX_ADHOC_BACKENDS: usize = 64;

/// A configured S3 store root: a backend's URL, or the bucket root.
#[derive(Debug, Clone)]
pub(crate) struct S3Root {
    at: StoreLocation,
    kind: RootKind,
}

#[derive(Debug, Clone)]
enum RootKind {
    /// The configured backend of this index in `Resolved::backends`.
    Backend(usize),
    /// `[gateway] bucket_root`: its URL (no trailing `/`) and options.
    Buckets(String, BackendOptions),
}

/// The S3 roots of `config`, each as the store it reaches with its own options.
pub(crate) fn s3_roots(config: &Resolved) -> Vec<S3Root> {
    let mut roots: Vec<S3Root> = config
        .backends
        .iter()
        .enumerate()
        .filter_map(|(i, b)| {
            StoreLocation::of_s3_url(&b.url, &b.options).map(|at| S3Root {
                at,
                kind: RootKind::Backend(i),
            })
        })
        .collect();
    if let Some((url, options)) = &config.bucket_root
        && let Some(at) = StoreLocation::of_s3_url(url, options)
    {
        roots.push(S3Root {
            at,
            kind: RootKind::Buckets(url.clone(), options.clone()),
        });
    }
    roots
}

impl Agent {
    /// Resolve a location to a backend and a key (or prefix). Accepted forms:
    ///
    /// - `NAME/key` or `NAME` for a configured backend;
    /// - a URL under a configured backend's URL, in any spelling of the same store;
    /// - an S3 URL under the S3 bucket root: the created bucket it names;
    /// - any other `s3://bucket/key`, opened ad hoc with `[s3_defaults]` and the AWS environment.
    ///
    /// Local paths that are not under a configured backend are refused: the API must not become a way to read
    /// arbitrary files of the agent's host.
    pub fn resolve(&self, location: &str) -> Result<(Backend, String)> {
        self.locate(location).map(|(_, b, k)| (b, k))
    }

    /// The catalog name of `location`'s backend (a configured backend's name or a created bucket's; ad hoc:
    /// none), the backend and the key.
    pub(crate) fn locate(&self, location: &str) -> Result<(Option<String>, Backend, String)> {
        if location.contains('\0') {
            return Err(Error::invalid_input("location contains a NUL byte"));
        }
        if !location.contains("://") {
            let (name, key) = location.split_once('/').unwrap_or((location, ""));
            return match self.backends.iter().find(|b| b.name == name) {
                Some(b) => Ok((Some(b.name.clone()), b.backend.clone(), key.to_string())),
                None => Err(Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "no backend named {name:?}; configured: {}",
                        self.backends
                            .iter()
                            .map(|b| b.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )),
            };
        }
        for b in &self.backends {
            if location == b.url {
                return Ok((Some(b.name.clone()), b.backend.clone(), String::new()));
            }
            if let Some(rest) = location.strip_prefix(&b.url)
                && let Some(key) = rest.strip_prefix('/')
            {
                return Ok((Some(b.name.clone()), b.backend.clone(), key.to_string()));
            }
        }
        let Some(here) = StoreLocation::of_s3_url(location, &self.config.s3_defaults) else {
            return Err(Error::invalid_input(format!(
                "{location:?} is not under a configured backend; only s3:// URLs can be used ad hoc"
            )));
        };
        for root in &self.s3_roots {
            let rel = here.against(&root.at);
            match (&root.kind, rel) {
                (_, Relation::Apart) => {}
                (RootKind::Backend(i), Relation::Inside(key)) => {
                    let b = &self.backends[*i];
                    return Ok((Some(b.name.clone()), b.backend.clone(), key));
                }
                (RootKind::Buckets(url, options), Relation::Inside(rest)) => {
                    let (bucket, key) = rest.split_once('/').unwrap_or((&rest, ""));
                    if bucket.is_empty() {
                        return Err(covering(location, "the gateway's bucket root"));
                    }
                    let url = format!("{url}/{bucket}");
                    let b = self.open_adhoc(&url, options, Some(bucket.to_string()))?;
                    return Ok((Some(bucket.to_string()), b, key.to_string()));
                }
                (RootKind::Backend(i), Relation::Covers) => {
                    let name = &self.backends[*i].name;
                    return Err(covering(location, &format!("backend {name:?}")));
                }
                (RootKind::Buckets(..), Relation::Covers) => {
                    return Err(covering(location, "the gateway's bucket root"));
                }
            }
        }
        let root = format!("s3://{}", here.bucket);
        let b = self.open_adhoc(&root, &self.config.s3_defaults, None)?;
        Ok((None, b, here.key))
    }

    /// The backend at `url` opened with `options` (kept open, at most [`MAX_ADHOC_BACKENDS`]), named `name`
    /// in the catalog.
    fn open_adhoc(
        &self,
        url: &str,
        options: &BackendOptions,
        name: Option<String>,
    ) -> Result<Backend> {
        let mut adhoc = self.adhoc.lock();
        if let Some((_, b)) = adhoc.get(url) {
            return Ok(b.clone());
        }
        if adhoc.len() >= MAX_ADHOC_BACKENDS {
            return Err(Error::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "too many ad-hoc backends open ({MAX_ADHOC_BACKENDS}); configure {url} as a backend"
                ),
            ));
        }
        let b = Backend::open(url, options, self.config.retry, self.telemetry.clone())?;
        adhoc.insert(url.to_string(), (name, b.clone()));
        Ok(b)
    }

    /// Open a backend rooted at `url` with the options of the store it lies in (a configured backend, the
    /// bucket root, in any spelling), or, for another S3 URL, with `[s3_defaults]` and the AWS environment.
    /// Other local paths are refused.
    pub fn open_url(&self, url: &str) -> Result<Backend> {
        let url = url.trim_end_matches('/');
        let open =
            |o: &BackendOptions| Backend::open(url, o, self.config.retry, self.telemetry.clone());
        for b in &self.config.backends {
            let base = b.url.trim_end_matches('/');
            if url == base || url.strip_prefix(base).is_some_and(|r| r.starts_with('/')) {
                return open(&b.options);
            }
        }
        let Some(here) = StoreLocation::of_s3_url(url, &self.config.s3_defaults) else {
            return Err(Error::invalid_input(format!(
                "{url:?} is not under a configured backend; only s3:// URLs can be used ad hoc"
            )));
        };
        // Opened by its canonical spelling (`s3a://`, `S3://` and `s3n://` are the same store).
        let canon = format!("s3://{}/{}", here.bucket, here.key);
        let open = |o: &BackendOptions| {
            Backend::open(
                canon.trim_end_matches('/'),
                o,
                self.config.retry,
                self.telemetry.clone(),
            )
        };
        for root in &self.s3_roots {
            if let Relation::Inside(_) = here.against(&root.at) {
                return match &root.kind {
                    RootKind::Backend(i) => open(&self.config.backends[*i].options),
                    RootKind::Buckets(_, options) => open(options),
                };
            }
        }
        open(&self.config.s3_defaults)
    }

    /// The backend whose canonical id is `id` (configured, or ad hoc and open) and its name in the catalog.
    pub fn backend_by_id(&self, id: &str) -> Option<(String, Backend)> {
        if let Some(b) = self.backends.iter().find(|b| &**b.backend.id() == id) {
            return Some((b.name.clone(), b.backend.clone()));
        }
        self.adhoc
            .lock()
            .values()
            .find(|(_, b)| &**b.id() == id)
            .map(|(n, b)| (n.clone().unwrap_or_else(|| b.id().to_string()), b.clone()))
    }
}

/// The refusal of a URL above a configured store.
fn covering(location: &str, what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!(
            "{location:?} covers {what} from above; name a location inside it (its owners decide there)"
        ),
    )
}
