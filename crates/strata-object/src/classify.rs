//! Every failure of a backend call as a [`strata_types::Error`] with a kind and a retryable flag: HTTP
//! statuses (5xx, 429 and 408 transient, the rest permanent), `object_store`'s error variants, transport
//! errors. The retry policy and every caller above decide on the kind alone.

use std::error::Error as StdError;

use strata_types::{Error, ErrorKind};

/// HTTP status → error kind. 5xx, 429 and 408 are transient; the rest are permanent.
pub(crate) fn status_kind(status: u16) -> ErrorKind {
    match status {
        404 => ErrorKind::NotFound,
        304 | 412 => ErrorKind::PreconditionFailed,
        409 => ErrorKind::AlreadyExists,
        401 => ErrorKind::Unauthenticated,
        403 => ErrorKind::PermissionDenied,
        408 => ErrorKind::Timeout,
        416 | 400 => ErrorKind::InvalidInput,
        429 | 500..=599 => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    }
}

/// A read pinned to ETag `expect` found `got`: the object changed under it (some servers ignore `If-Match`,
/// so the response's ETag is checked too).
pub(crate) fn changed(what: &str, got: &str, expect: &str) -> Error {
    Error::new(
        ErrorKind::PreconditionFailed,
        format!("{what}: object changed (ETag {got}, expected {expect})"),
    )
}

/// Map an `object_store` error to a typed Strata error with a kind and a retryable flag.
///
/// `object_store` reports HTTP failures as `Generic` errors; their source chain holds either a transport
/// error (`object_store::client::HttpError`, retryable unless it is a decode error of a complete response) or a
/// status, which we read from the error text (`... status code: 503 ...`) because the typed error is private.
pub fn classify(err: object_store::Error, what: &str) -> Error {
    use object_store::Error as E;
    let kind = match &err {
        E::NotFound { .. } => ErrorKind::NotFound,
        E::AlreadyExists { .. } => ErrorKind::AlreadyExists,
        E::Precondition { .. } | E::NotModified { .. } => ErrorKind::PreconditionFailed,
        E::InvalidPath { .. } => ErrorKind::InvalidInput,
        E::NotSupported { .. } | E::NotImplemented { .. } => ErrorKind::Unsupported,
        E::PermissionDenied { .. } => ErrorKind::PermissionDenied,
        E::Unauthenticated { .. } => ErrorKind::Unauthenticated,
        E::UnknownConfigurationKey { .. } => ErrorKind::Config,
        E::JoinError { .. } => ErrorKind::Internal,
        E::Generic { source, .. } => classify_generic(source.as_ref()),
        _ => ErrorKind::Internal,
    };
    let retryable = kind.default_retryable();
    Error::new(kind, format!("{what}: {err}"))
        .with_retryable(retryable)
        .with_source(err)
}

fn classify_generic(source: &(dyn StdError + Send + Sync + 'static)) -> ErrorKind {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(source);
    while let Some(e) = cur {
        if let Some(http) = e.downcast_ref::<object_store::client::HttpError>() {
            use object_store::client::HttpErrorKind as K;
            return match http.kind() {
                K::Timeout => ErrorKind::Timeout,
                K::Connect | K::Request | K::Interrupted | K::Decode => ErrorKind::Unavailable,
                _ => ErrorKind::Unavailable,
            };
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::NotFound => ErrorKind::NotFound,
                std::io::ErrorKind::StorageFull => ErrorKind::NoSpace,
                std::io::ErrorKind::TimedOut => ErrorKind::Timeout,
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof => ErrorKind::Unavailable,
                _ => ErrorKind::Io,
            };
        }
        let text = e.to_string();
        if let Some(status) = status_in_text(&text) {
            return status_kind(status);
        }
        // Local and in-memory stores report an unsatisfiable range as a private error type.
        if text.contains("Invalid range") || text.contains("Wanted range starting at") {
            return ErrorKind::InvalidInput;
        }
        cur = e.source();
    }
    ErrorKind::Internal
}

/// Finds `status code: NNN` (object_store's wording for a non-2xx response) in an error message.
fn status_in_text(text: &str) -> Option<u16> {
    let idx = text.find("status code: ")?;
    let digits = text.get(idx + 13..idx + 16)?;
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_kinds() {
        assert_eq!(status_kind(503), ErrorKind::Unavailable);
        assert!(status_kind(503).default_retryable());
        assert_eq!(status_kind(429), ErrorKind::Unavailable);
        assert_eq!(status_kind(404), ErrorKind::NotFound);
        assert!(!status_kind(403).default_retryable());
        assert_eq!(
            status_in_text("Server returned non-2xx status code: 503 Service"),
            Some(503)
        );
        assert_eq!(status_in_text("nothing here"), None);
    }

    #[test]
    fn object_store_errors_are_typed() {
        let e = classify(
            object_store::Error::NotFound {
                path: "k".into(),
                source: "gone".into(),
            },
            "head k",
        );
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(!e.is_retryable());
        let e = classify(
            object_store::Error::Generic {
                store: "S3",
                source: "Server returned non-2xx status code: 500 Internal Server Error".into(),
            },
            "get k",
        );
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
    }
}
