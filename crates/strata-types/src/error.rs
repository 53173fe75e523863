use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

/// Result alias used across Strata's library crates.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, independent of where. Callers branch on the kind, never on the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The object, block or resource does not exist.
    NotFound,
    /// A create-only write found an existing object.
    AlreadyExists,
    /// A condition (If-Match, expected version) did not hold: typically the object changed.
    PreconditionFailed,
    /// The request itself is malformed: bad key, bad range, bad URL.
    InvalidInput,
    /// A byte range that the object cannot satisfy (it starts at or past the end).
    InvalidRange,
    /// Configuration is invalid; the message says which field and why.
    Config,
    /// Credentials are valid but not allowed to do this.
    PermissionDenied,
    /// Credentials are missing or invalid.
    Unauthenticated,
    /// The remote service is unavailable or overloaded (5xx, 429, connection refused or reset).
    Unavailable,
    /// The operation took too long.
    Timeout,
    /// A local I/O error (EIO and friends).
    Io,
    /// A local device is full (ENOSPC).
    NoSpace,
    /// Bytes failed verification (checksum mismatch, truncated file, bad header).
    Corrupt,
    /// The backend does not support this operation.
    Unsupported,
    /// The operation was cancelled, usually by shutdown.
    Cancelled,
    /// A bounded resource (queue, budget, quota) is exhausted.
    ResourceExhausted,
    /// A bug or an unexpected state; the message has details.
    Internal,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 17] = [
        ErrorKind::NotFound,
        ErrorKind::AlreadyExists,
        ErrorKind::PreconditionFailed,
        ErrorKind::InvalidInput,
        ErrorKind::InvalidRange,
        ErrorKind::Config,
        ErrorKind::PermissionDenied,
        ErrorKind::Unauthenticated,
        ErrorKind::Unavailable,
        ErrorKind::Timeout,
        ErrorKind::Io,
        ErrorKind::NoSpace,
        ErrorKind::Corrupt,
        ErrorKind::Unsupported,
        ErrorKind::Cancelled,
        ErrorKind::ResourceExhausted,
        ErrorKind::Internal,
    ];

    /// The kind named by [`ErrorKind::as_str`], as read back from a wire (`None` for a name this build does
    /// not know).
    pub fn parse(name: &str) -> Option<ErrorKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether errors of this kind are usually transient. [`Error::is_retryable`] is the authority for a given
    /// error; this is the default used by [`Error::new`].
    pub fn default_retryable(self) -> bool {
        matches!(self, ErrorKind::Unavailable | ErrorKind::Timeout)
    }

    /// A short, stable, snake_case name, used in metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::PreconditionFailed => "precondition_failed",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::InvalidRange => "invalid_range",
            ErrorKind::Config => "config",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Io => "io",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

struct Inner {
    kind: ErrorKind,
    retryable: bool,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

/// Strata's error: a kind, a retryable flag, a human message and an optional source.
///
/// Cheap to clone (one `Arc`), so one failed fetch can be reported to every waiter of a single-flight read.
#[derive(Clone)]
pub struct Error(Arc<Inner>);

impl Error {
    /// An error of `kind` with the kind's default retryability.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self(Arc::new(Inner {
            kind,
            retryable: kind.default_retryable(),
            message: message.into(),
            source: None,
        }))
    }

    /// Attach the underlying cause.
    pub fn with_source(self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.map_inner(|i| i.source = Some(Box::new(source)))
    }

    /// Override whether a retry may help.
    pub fn with_retryable(self, retryable: bool) -> Self {
        self.map_inner(|i| i.retryable = retryable)
    }

    /// Prefix the message with context (`"reading block 3 of s3://b/k: ..."`).
    pub fn context(self, ctx: impl fmt::Display) -> Self {
        self.map_inner(|i| i.message = format!("{ctx}: {}", i.message))
    }

    fn map_inner(self, f: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = match Arc::try_unwrap(self.0) {
            Ok(inner) => inner,
            Err(shared) => Inner {
                kind: shared.kind,
                retryable: shared.retryable,
                message: shared.message.clone(),
                source: shared.source.as_ref().map(|s| {
                    Box::new(StringError(s.to_string())) as Box<dyn StdError + Send + Sync>
                }),
            },
        };
        f(&mut inner);
        Self(Arc::new(inner))
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// Whether the same operation may succeed if tried again.
    pub fn is_retryable(&self) -> bool {
        self.0.retryable
    }

    /// The human message, without the source chain.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// Shorthand constructors for the common kinds.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }
    /// A configuration error.
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, message)
    }
    /// An internal error (a bug).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// Classify a local I/O error: ENOSPC becomes [`ErrorKind::NoSpace`], missing files
    /// [`ErrorKind::NotFound`], everything else [`ErrorKind::Io`].
    pub fn from_io(err: std::io::Error, context: impl fmt::Display) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::StorageFull => ErrorKind::NoSpace,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            std::io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
            std::io::ErrorKind::TimedOut => ErrorKind::Timeout,
            _ if err.raw_os_error() == Some(28) => ErrorKind::NoSpace,
            _ => ErrorKind::Io,
        };
        Self::new(kind, format!("{context}: {err}")).with_source(err)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.0.kind)
            .field("retryable", &self.0.retryable)
            .field("message", &self.0.message)
            .field("source", &self.0.source)
            .finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.message)
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0
            .source
            .as_ref()
            .map(|s| s.as_ref() as &(dyn StdError + 'static))
    }
}

#[derive(Debug)]
struct StringError(String);
impl fmt::Display for StringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl StdError for StringError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_carry_default_retryability() {
        assert!(Error::new(ErrorKind::Unavailable, "x").is_retryable());
        assert!(!Error::new(ErrorKind::NotFound, "x").is_retryable());
        assert!(
            Error::new(ErrorKind::Io, "x")
                .with_retryable(true)
                .is_retryable()
        );
    }

    #[test]
    fn every_kind_parses_back_from_its_name() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(ErrorKind::parse("no_such_kind"), None);
    }

    #[test]
    fn enospc_is_no_space() {
        let e = Error::from_io(std::io::Error::from_raw_os_error(28), "writing block");
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert!(e.message().starts_with("writing block: "));
    }

    #[test]
    fn context_keeps_kind_when_shared() {
        let e = Error::new(ErrorKind::Corrupt, "bad");
        let clone = e.clone();
        let e2 = clone.context("block 3");
        assert_eq!(e2.kind(), ErrorKind::Corrupt);
        assert_eq!(e2.message(), "block 3: bad");
        assert_eq!(e.message(), "bad");
    }
}
