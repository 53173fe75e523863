//! Who is calling: the administrator's bootstrap, and the middleware that turns a bearer token into a
//! [`Principal`] (cached for a few seconds) on every route but the public ones.

use super::common::*;
use super::state::TOKEN_CACHE;

/// Where a generated administrator token is written (where clients look for it too).
pub use strata_client::token::admin_token_file;

/// Make sure the catalog has an administrator: `admin_token` if set (`STRATA_ADMIN_TOKEN`, shared by the
/// agents of a cluster), else a generated token written to `<data_dir>/admin-token` (mode 0600) on first
/// start.
pub async fn bootstrap_admin(
    catalog: &Catalog,
    data_dir: &Path,
    admin_token: Option<&str>,
) -> Result<()> {
    let env = admin_token.filter(|t| !t.is_empty());
    let file = admin_token_file(data_dir);
    match catalog.bootstrap_admin(env).await? {
        Some(token) => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::remove_file(&file);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .map_err(|e| Error::from_io(e, format!("creating {}", file.display())))?;
            f.write_all(format!("{token}\n").as_bytes())
                .map_err(|e| Error::from_io(e, format!("writing {}", file.display())))?;
            tracing::info!(token_file = %file.display(), "created the administrator; its API token is in the token file");
        }
        None if env.is_none() && file.exists() => {
            tracing::info!(token_file = %file.display(), "administrator token file")
        }
        None => {}
    }
    Ok(())
}

/// The paths of the endpoints the contract declares public ([`crate::http::Access::Public`]; none takes a
/// parameter).
fn public_paths() -> &'static std::collections::HashSet<&'static str> {
    static PUBLIC: std::sync::OnceLock<std::collections::HashSet<&'static str>> =
        std::sync::OnceLock::new();
    PUBLIC.get_or_init(|| {
        strata_api::endpoints()
            .into_iter()
            .filter(|d| d.rule == crate::http::Access::Public)
            .map(|d| d.path)
            .collect()
    })
}

/// Middleware: every request but `/healthz` and the public routes of the table (`/openapi.json`, the claim
/// schema) must carry a valid bearer token.
pub async fn require_token(
    State(agent): State<Arc<Agent>>,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if path == "/healthz" || public_paths().contains(path) {
        return next.run(req).await;
    }
    // Another agent of the cluster: only the peer routes take its credential, and on them it stands in for a
    // token. No token is accepted in its place.
    if path.starts_with("/v1/peer/")
        && let Some(key) = req.headers().get(strata_client::CLUSTER_KEY_HEADER)
    {
        let team = req
            .headers()
            .get(strata_client::CLUSTER_TEAM_HEADER)
            .map(|v| v.as_bytes().to_vec());
        return match crate::access::cluster_call(&agent, key.as_bytes(), team.as_deref()) {
            Ok(call) => {
                req.extensions_mut().insert(call);
                next.run(req).await
            }
            Err(e) => ApiError(e).into_response(),
        };
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= 512)
        .map(str::to_string);
    let Some(token) = token else {
        return ApiError(Error::new(
            ErrorKind::Unauthenticated,
            "this route needs `Authorization: Bearer <token>` (see `strata token create`; the administrator's \
             token is in <data-dir>/admin-token or STRATA_ADMIN_TOKEN)",
        ))
        .into_response();
    };
    match authenticate(&agent, &token).await {
        Ok(Some(p)) => {
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Ok(None) => ApiError(Error::new(
            ErrorKind::Unauthenticated,
            "the token is not valid (unknown or revoked)",
        ))
        .into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}

async fn authenticate(agent: &Agent, token: &str) -> Result<Option<Principal>> {
    let key = blake3::hash(token.as_bytes()).to_hex().to_string();
    let cached = agent.access.tokens.lock().get(&key).cloned();
    if let Some((at, p)) = &cached
        && at.elapsed() < TOKEN_CACHE
    {
        return Ok(Some(p.clone()));
    }
    // While the catalog is away, a token it accepted lately still is ([`crate::outage`]).
    // Only a fresh answer is remembered (a cached one stands in without being renewed).
    let fetch = async {
        let p = agent.catalog().authenticate(token).await?;
        if let Some(p) = &p {
            let mut cache = agent.access.tokens.lock();
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(key.clone(), (std::time::Instant::now(), p.clone()));
        }
        Ok(p)
    };
    agent
        .ownership()
        .outage()
        .fetch("token", cached.map(|(at, p)| (at, Some(p))), fetch)
        .await
}
