//! Errors on the agent's wire: one body, one status per kind, read back with kind and retryable intact.

use strata_types::{Error, ErrorKind};

/// The JSON body of every failed agent request (the contract's, [`strata_api::ErrorBody`]).
pub use strata_api::ErrorBody;

/// The HTTP status an error of `kind` is answered with. Distinct statuses for the kinds a client acts on
/// differently: `Corrupt` (422) is never mistaken for a server that is down, `NoSpace` (507) names a full
/// device.
pub fn status_of(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::NotFound => 404,
        ErrorKind::InvalidInput | ErrorKind::Config => 400,
        ErrorKind::PreconditionFailed => 412,
        ErrorKind::InvalidRange => 416,
        ErrorKind::AlreadyExists => 409,
        ErrorKind::PermissionDenied => 403,
        ErrorKind::Unauthenticated => 401,
        ErrorKind::Corrupt => 422,
        ErrorKind::ResourceExhausted => 429,
        ErrorKind::Unsupported => 501,
        ErrorKind::Unavailable => 503,
        ErrorKind::Timeout => 504,
        ErrorKind::NoSpace => 507,
        _ => 500,
    }
}

/// The kind a status stands for when the body does not say (an answer from something other than an agent:
/// a proxy, a load balancer). Unknown 5xx are `Unavailable` (retryable), unknown 4xx `InvalidInput`.
pub fn kind_of_status(status: u16) -> ErrorKind {
    match status {
        400 => ErrorKind::InvalidInput,
        416 => ErrorKind::InvalidRange,
        401 => ErrorKind::Unauthenticated,
        403 => ErrorKind::PermissionDenied,
        404 => ErrorKind::NotFound,
        409 => ErrorKind::AlreadyExists,
        412 => ErrorKind::PreconditionFailed,
        422 => ErrorKind::Corrupt,
        429 => ErrorKind::ResourceExhausted,
        501 => ErrorKind::Unsupported,
        504 => ErrorKind::Timeout,
        507 => ErrorKind::NoSpace,
        500..=599 => ErrorKind::Unavailable,
        _ => ErrorKind::InvalidInput,
    }
}

/// The error an agent answered with `status` and `body`: kind, retryable flag and message from an
/// [`ErrorBody`]; from the status alone when the body is not one (or names a kind this build does not know).
pub fn error_from_response(status: u16, body: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => {
            let kind = ErrorKind::parse(&b.error).unwrap_or_else(|| kind_of_status(status));
            Error::new(kind, format!("{} (HTTP {status})", b.message)).with_retryable(b.retryable)
        }
        Err(_) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
            let text = text.trim();
            let message = if text.is_empty() {
                format!("HTTP {status}")
            } else {
                format!("HTTP {status}: {text}")
            };
            Error::new(kind_of_status(status), message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_survives_the_round_trip() {
        for kind in ErrorKind::ALL {
            for retryable in [false, true] {
                let e = Error::new(kind, "boom").with_retryable(retryable);
                let body = serde_json::to_vec(&ErrorBody::of(&e)).unwrap_or_default();
                let back = error_from_response(status_of(kind), &body);
                assert_eq!(back.kind(), kind);
                assert_eq!(back.is_retryable(), retryable, "{kind}");
                assert!(back.message().starts_with("boom"), "{}", back.message());
            }
        }
    }

    #[test]
    fn a_status_alone_still_says_what_it_can() {
        let e = error_from_response(502, b"<html>bad gateway</html>");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
        let e = error_from_response(422, b"");
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(!e.is_retryable(), "corruption is never retried");
        assert_eq!(error_from_response(404, b"{}").kind(), ErrorKind::NotFound);
    }

    #[test]
    fn the_kinds_a_client_acts_on_have_statuses_of_their_own() {
        for kind in ErrorKind::ALL {
            let status = status_of(kind);
            if status != 500 && status != 400 {
                assert_eq!(kind_of_status(status), kind, "{kind} -> {status}");
            }
        }
    }
}
