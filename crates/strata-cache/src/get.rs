//! The cache's front door for reads: [`BlockCache::get`] (and [`BlockCache::prefetch`], its hint).
//!
//! A caller says what it wants (an object, a [`ByteRange`] of it, conditions on its version, or exactly a
//! version it learned before) and gets a [`GetResult`]: the metadata, the resolved range and a [`GetBody`]
//! stream of `Bytes`. Everything about *how* is decided here, not by the caller (the S3 gateway's GetObject,
//! HeadObject and CopyObject, the agent's `/v1/read` and `/v1/prefetch`, the loader's in-process source):
//!
//! - **How to open.** A read of the object's start (no range, or `bytes=0-N`) learns the version from a GET
//!   of those bytes ([`BlockCache::open_object_reading`]): one origin request for a whole small object or the
//!   first part of a large one. A read that starts later, and a HEAD, ask for the metadata (or take it from
//!   the metadata cache). A caller that pins a version ([`GetOptions::version`]) skips the lookup.
//! - **Conditions** (RFC 9110 order, as S3 evaluates them): `If-Match`, else `If-Unmodified-Since`, failing
//!   with [`ErrorKind::PreconditionFailed`]; then `If-None-Match`, else `If-Modified-Since`, answered with
//!   [`GetResult::not_modified`] and no body.
//! - **Ranges** resolve as S3 does ([`ByteRange::resolve`]); one that is not satisfiable is
//!   [`ErrorKind::InvalidRange`].
//! - **The body.** Inside one block held by the RAM tier: that block's bytes, no bookkeeping (the hot path of
//!   small objects). Otherwise the whole range is prefetched as runs (one backend request per run of cold
//!   blocks) and streamed block by block by a task that reads the next block only once the consumer took the
//!   last, so a body holds at most two blocks. A block fetched ahead for the body, or read from the disk tier,
//!   carries its share of the in-flight budget, which the body keeps until the consumer asks for the next
//!   chunk: bytes on their way to a slow client stay inside the budget.

use crate::budget::Share;
use crate::reader::CachedObject;
use Failure::Fill;
use bytes::Bytes;
use futures::Stream;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use strata_object::Backend;
use tokio::sync::mpsc;

use strata_types::{Error, ErrorKind, IoContext, ObjectMeta, Result};

use crate::state::{BlockCache, ObjState};

/// The bytes a read asks for, as an HTTP `Range` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// `bytes=first-last` (inclusive; `last` past the end is clamped).
    Bounded {
        /// First byte.
        first: u64,
        /// Last byte, inclusive.
        last: u64,
    },
    /// `bytes=first-`: from `first` to the end.
    From {
        /// First byte.
        first: u64,
    },
    /// `bytes=-len`: the last `len` bytes.
    Suffix {
        /// How many bytes from the end.
        len: u64,
    },
}

impl ByteRange {
    /// Parse one `Range` header value (`bytes=a-b`, `bytes=a-` or `bytes=-n`; several ranges are not
    /// supported).
    pub fn parse(header: &str) -> Result<Self> {
        let bad = || {
            Error::invalid_input(format!(
                "unsupported Range header {header:?}: expected bytes=a-b, bytes=a- or bytes=-n"
            ))
        };
        let spec = header.trim().strip_prefix("bytes=").ok_or_else(bad)?;
        if spec.contains(',') {
            return Err(bad());
        }
        let (a, b) = spec.split_once('-').ok_or_else(bad)?;
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
        match (a.trim(), b.trim()) {
            ("", "") => Err(bad()),
            ("", n) => Ok(ByteRange::Suffix { len: num(n)? }),
            (a, "") => Ok(ByteRange::From { first: num(a)? }),
            (a, b) => {
                let (first, last) = (num(a)?, num(b)?);
                if last < first {
                    return Err(bad());
                }
                Ok(ByteRange::Bounded { first, last })
            }
        }
    }

    /// The bytes of an object of `size` bytes this range names, as S3 resolves them: a start at or past the
    /// end, or an empty suffix, is not satisfiable ([`ErrorKind::InvalidRange`]); an end past it is clamped.
    pub fn resolve(&self, size: u64) -> Result<Range<u64>> {
        let unsatisfiable = || {
            Error::new(
                ErrorKind::InvalidRange,
                format!("the range {self} is not satisfiable for an object of {size} bytes"),
            )
        };
        match *self {
            ByteRange::Bounded { first, last } => {
                if first >= size || last < first {
                    return Err(unsatisfiable());
                }
                Ok(first..last.min(size - 1) + 1)
            }
            ByteRange::From { first } => {
                if first >= size {
                    return Err(unsatisfiable());
                }
                Ok(first..size)
            }
            ByteRange::Suffix { len } => {
                if len == 0 {
                    return Err(unsatisfiable());
                }
                Ok(size - len.min(size)..size)
            }
        }
    }

    /// How many bytes from the object's start the range reads, when it starts at byte 0.
    fn read_from_start(&self) -> Option<u64> {
        match *self {
            ByteRange::Bounded { first: 0, last } => Some(last.saturating_add(1)),
            ByteRange::From { first: 0 } => Some(1),
            _ => None,
        }
    }
}

impl std::fmt::Display for ByteRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ByteRange::Bounded { first, last } => write!(f, "bytes={first}-{last}"),
            ByteRange::From { first } => write!(f, "bytes={first}-"),
            ByteRange::Suffix { len } => write!(f, "bytes=-{len}"),
        }
    }
}

/// An entity-tag condition (`If-Match`, `If-None-Match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ETagMatch {
    /// `*`: any version.
    Any,
    /// A strong ETag (without quotes).
    Strong(String),
    /// A weak ETag (`W/"..."`): never matches, as conditions compare strongly.
    Weak(String),
}

impl ETagMatch {
    fn matches(&self, meta: &ObjectMeta) -> bool {
        match self {
            ETagMatch::Any => true,
            ETagMatch::Strong(want) => meta
                .etag
                .as_deref()
                .is_some_and(|have| plain_etag(have) == want.trim_matches('"')),
            ETagMatch::Weak(_) => false,
        }
    }
}

/// An ETag as clients see it: without quotes or a weak marker.
pub fn plain_etag(raw: &str) -> &str {
    raw.trim_start_matches("W/").trim_matches('"')
}

/// What a [`BlockCache::get`] asks for. `GetOptions::default()` reads the whole object.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct GetOptions {
    /// The bytes wanted (the whole object when `None`).
    pub range: Option<ByteRange>,
    /// Read only if the object's ETag matches.
    pub if_match: Option<ETagMatch>,
    /// Answer [`GetResult::not_modified`] if the ETag matches.
    pub if_none_match: Option<ETagMatch>,
    /// Answer [`GetResult::not_modified`] unless modified after this time (Unix seconds).
    pub if_modified_since: Option<i64>,
    /// Read only if not modified after this time (Unix seconds).
    pub if_unmodified_since: Option<i64>,
    /// Only the metadata: the result's body is empty and nothing is fetched but the metadata.
    pub head: bool,
    /// Read exactly this version, learned earlier (a loader pins the version it saw first for the whole
    /// epoch): no metadata lookup; fills are still pinned to it, so a changed object fails the read with
    /// [`ErrorKind::PreconditionFailed`] instead of mixing versions.
    pub version: Option<ObjectMeta>,
}

impl GetOptions {
    /// Read `range` (see [`GetOptions::range`]).
    pub fn range(mut self, range: ByteRange) -> Self {
        self.range = Some(range);
        self
    }

    /// Read bytes `range` (a half-open Rust range, not empty: an empty one is not satisfiable).
    pub fn bytes(self, range: Range<u64>) -> Self {
        if range.end <= range.start {
            return self.range(ByteRange::Suffix { len: 0 });
        }
        self.range(ByteRange::Bounded {
            first: range.start,
            last: range.end - 1,
        })
    }

    /// Only the metadata.
    pub fn head(mut self) -> Self {
        self.head = true;
        self
    }

    /// Read exactly `meta`'s version (see [`GetOptions::version`]).
    pub fn version(mut self, meta: ObjectMeta) -> Self {
        self.version = Some(meta);
        self
    }

    /// `None` when the conditions hold; `Some(true)` when the answer is "not modified"; an error when a
    /// precondition fails.
    fn evaluate(&self, meta: &ObjectMeta) -> Result<bool> {
        if let Some(c) = &self.if_match {
            if !c.matches(meta) {
                return Err(Error::new(
                    ErrorKind::PreconditionFailed,
                    "If-Match does not match the object's ETag",
                ));
            }
        } else if let Some(t) = self.if_unmodified_since
            && meta.last_modified_unix > t
        {
            return Err(Error::new(
                ErrorKind::PreconditionFailed,
                "the object was modified since If-Unmodified-Since",
            ));
        }
        if let Some(c) = &self.if_none_match {
            return Ok(c.matches(meta));
        }
        Ok(self
            .if_modified_since
            .is_some_and(|t| meta.last_modified_unix <= t))
    }
}

/// What a [`BlockCache::get`] found.
#[derive(Debug)]
pub struct GetResult {
    /// The object's metadata (the version read).
    pub meta: ObjectMeta,
    /// The bytes the body holds (the whole object without a range).
    pub range: Range<u64>,
    /// Whether a range was asked for (an HTTP front answers 206 with a `Content-Range`).
    pub partial: bool,
    /// A condition said "not modified" (`If-None-Match`, `If-Modified-Since`): the body is empty.
    pub not_modified: bool,
    /// The bytes.
    pub body: GetBody,
    object: Arc<ObjState>,
}

impl GetResult {
    /// `Content-Range` of a partial read (`bytes a-b/size`).
    pub fn content_range(&self) -> Option<String> {
        self.partial.then(|| {
            format!(
                "bytes {}-{}/{}",
                self.range.start,
                self.range.end.saturating_sub(1),
                self.meta.size
            )
        })
    }

    /// Note a read of this version at `at` (seconds): true if none was noted in the `resolution` seconds
    /// before, so the caller should record it. The mark is shared by every read of the version while its
    /// metadata is cached: for a hot object, at most one read per `resolution` sees true.
    pub fn mark_read(&self, at: i64, resolution: i64) -> bool {
        self.object.mark_read(at, resolution)
    }
}

/// A block on its way out, with its share of the in-flight budget when it holds one.
type Outgoing = (Result<Bytes>, Option<Share>);

/// The bytes of a [`GetResult`], block by block. `Send + Sync + 'static`, as HTTP servers need. It keeps the
/// budget share of the block it handed out last until it is asked for the next one.
pub struct GetBody {
    inner: BodyInner,
    held: Option<Share>,
}

enum BodyInner {
    Ready(Option<Bytes>),
    Channel(mpsc::Receiver<Outgoing>),
}

impl std::fmt::Debug for GetBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GetBody").finish_non_exhaustive()
    }
}

impl GetBody {
    fn empty() -> Self {
        Self::ready(Bytes::new())
    }

    fn ready(b: Bytes) -> Self {
        Self {
            inner: BodyInner::Ready((!b.is_empty()).then_some(b)),
            held: None,
        }
    }

    /// The whole body in one buffer.
    pub async fn collect(self) -> Result<Bytes> {
        use futures::TryStreamExt;
        let parts: Vec<Bytes> = self.try_collect().await?;
        Ok(match parts.len() {
            0 => Bytes::new(),
            1 => parts.into_iter().next().unwrap_or_default(),
            _ => Bytes::from(parts.concat()),
        })
    }
}

impl Stream for GetBody {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // The consumer took the last block: its share goes back.
        self.held = None;
        match &mut self.inner {
            BodyInner::Ready(b) => Poll::Ready(b.take().map(Ok)),
            BodyInner::Channel(rx) => match rx.poll_recv(cx) {
                Poll::Ready(Some((r, share))) => {
                    self.held = share;
                    Poll::Ready(Some(r))
                }
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl BlockCache {
    /// Read an object, or part of it, through the cache: the read call of the front ends (the S3 gateway's
    /// GetObject, HeadObject and CopyObject, the agent's `/v1/read`, the loader's in-process source). See the
    /// module docs of `get.rs` for what it decides.
    pub async fn get(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        opts: GetOptions,
    ) -> Result<GetResult> {
        match self.get_once(ctx, backend, key, &opts).await {
            // The object changed at the backend since its metadata was cached, and nothing went out yet: the
            // fill forgot that metadata, so this open finds the new version (once: a second change in between
            // is the caller's error to see).
            Err(Fill(e)) if e.kind() == ErrorKind::PreconditionFailed => {
                self.inner
                    .counters
                    .stale_retried
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.get_once(ctx, backend, key, &opts)
                    .await
                    .map_err(Failure::into_error)
            }
            r => r.map_err(Failure::into_error),
        }
    }

    async fn get_once(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        opts: &GetOptions,
    ) -> std::result::Result<GetResult, Failure> {
        let obj = self.open_for(ctx, backend, key, opts).await?;
        let meta = obj.meta().clone();
        let not_modified = opts.evaluate(&meta)?;
        let (range, partial) = match &opts.range {
            Some(r) => (r.resolve(meta.size)?, true),
            None => (0..meta.size, false),
        };
        if not_modified || opts.head {
            return Ok(GetResult {
                meta,
                range,
                partial,
                not_modified,
                body: GetBody::empty(),
                object: obj.obj.clone(),
            });
        }
        let object = obj.obj.clone();
        let body = match obj.read_cached(range.clone()) {
            // Hot and inside one block (most small objects): no readahead bookkeeping.
            Some(b) => GetBody::ready(b),
            None => {
                // One backend request for the whole range when it is cold, not one per block. A one-block
                // read takes no part in that: it never waits for budget (as a reader's own miss never does),
                // so a node busy with hints and readahead still answers small reads at once.
                let bs = self.config().block_size.bytes();
                if range.start / bs != range.end.saturating_sub(1) / bs {
                    obj.prefetch(range.clone(), true).await;
                }
                self.stream(obj, range.clone()).await.map_err(Fill)?
            }
        };
        Ok(GetResult {
            meta,
            range,
            partial,
            not_modified: false,
            body,
            object,
        })
    }

    /// Start fetching what `opts` names into the cache (runs of consecutive cold blocks, one backend request
    /// each, as far as the in-flight budget allows now) and return once they are started: a hint, for a loader
    /// entering a shuffle window. The blocks are *staged*: held with their budget share, whatever the tiers
    /// admit, until the first read of each takes it or [`crate::CacheConfig::prefetch_hold_ms`] passes (`stage.rs`), so the
    /// bytes a hint fetched are not fetched again. Conditions are checked as by [`BlockCache::get`].
    pub async fn prefetch(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        opts: GetOptions,
    ) -> Result<()> {
        let opts = GetOptions { head: true, ..opts };
        let obj = self.open_for(ctx, backend, key, &opts).await?;
        if opts.evaluate(obj.meta())? {
            return Ok(());
        }
        let range = match &opts.range {
            Some(r) => r.resolve(obj.meta().size)?,
            None => 0..obj.meta().size,
        };
        self.stage(ctx, &obj.obj, range);
        Ok(())
    }

    async fn open_for(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        opts: &GetOptions,
    ) -> Result<CachedObject> {
        if let Some(meta) = &opts.version {
            return Ok(self.object_from_meta(ctx, backend, meta.clone()));
        }
        match opts
            .range
            .as_ref()
            .map_or(Some(1), ByteRange::read_from_start)
        {
            Some(upto) if !opts.head => self.open_object_reading(ctx, backend, key, upto).await,
            _ => self.open_object(ctx, backend, key).await,
        }
    }

    /// `range` of an open object as a body.
    async fn stream(&self, obj: CachedObject, range: Range<u64>) -> Result<GetBody> {
        let bs = self.config().block_size.bytes();
        // The first block is read now, so that its errors (a changed object above all) reach the caller
        // before any header goes out.
        let first_end = (range.start + bs - range.start % bs).min(range.end);
        let (b, share) = obj.read_block(range.start..first_end).await?;
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.try_send((Ok(b), share));
        if first_end >= range.end {
            return Ok(GetBody {
                inner: BodyInner::Channel(rx),
                held: None,
            });
        }
        tokio::spawn(async move {
            let mut off = first_end;
            while off < range.end {
                let next = (off + bs - off % bs).min(range.end);
                // Read the next block once the consumer has taken the last one, not before: a body holds at
                // most two blocks (the one going out, the one being read), which bounds the memory of many
                // large hot reads served from the disk tier.
                let Ok(slot) = tx.reserve().await else { return };
                let (r, share) = match obj.read_block(off..next).await {
                    Ok((b, share)) => (Ok(b), share),
                    Err(e) => (Err(e), None),
                };
                let failed = r.is_err();
                slot.send((r, share));
                if failed {
                    return;
                }
                off = next;
            }
        });
        Ok(GetBody {
            inner: BodyInner::Channel(rx),
            held: None,
        })
    }
}

/// Why one attempt of [`BlockCache::get`] failed: before reading (opening, conditions) or reading the
/// bytes (a fill), which alone may have found the object changed.
enum Failure {
    Before(Error),
    Fill(Error),
}

impl Failure {
    fn into_error(self) -> Error {
        match self {
            Failure::Before(e) | Failure::Fill(e) => e,
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Before(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_resolve_as_s3_does() {
        let r = |h: &str, size: u64| ByteRange::parse(h).and_then(|r| r.resolve(size));
        assert_eq!(r("bytes=0-9", 100).ok(), Some(0..10));
        assert_eq!(r("bytes=90-", 100).ok(), Some(90..100));
        assert_eq!(r("bytes=-5", 100).ok(), Some(95..100));
        assert_eq!(r("bytes=-500", 100).ok(), Some(0..100));
        assert_eq!(r("bytes=50-500", 100).ok(), Some(50..100));
        for bad in [
            "bytes=9-1",
            "items=0-1",
            "bytes=a-b",
            "bytes=0-1,3-4",
            "bytes=-",
        ] {
            let e = ByteRange::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad}");
        }
        for unsatisfiable in ["bytes=100-", "bytes=100-200", "bytes=-0"] {
            let e = r(unsatisfiable, 100).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidRange, "{unsatisfiable}");
        }
        assert_eq!(
            r("bytes=0-", 0).unwrap_err().kind(),
            ErrorKind::InvalidRange
        );
    }

    fn meta(etag: &str, modified: i64) -> ObjectMeta {
        ObjectMeta {
            key: "k".into(),
            size: 10,
            etag: Some(etag.into()),
            version: None,
            last_modified_unix: modified,
            attrs: None,
        }
    }

    #[test]
    fn conditions_follow_rfc_9110_order() {
        let m = meta("\"abc\"", 1000);
        let o = |f: fn(&mut GetOptions)| {
            let mut o = GetOptions::default();
            f(&mut o);
            o.evaluate(&m)
        };
        assert!(!o(|_| {}).unwrap());
        assert!(!o(|o| o.if_match = Some(ETagMatch::Strong("abc".into()))).unwrap());
        assert!(!o(|o| o.if_match = Some(ETagMatch::Any)).unwrap());
        let e = o(|o| o.if_match = Some(ETagMatch::Strong("xyz".into()))).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PreconditionFailed);
        let e = o(|o| o.if_match = Some(ETagMatch::Weak("abc".into()))).unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::PreconditionFailed,
            "weak tags never match"
        );
        // If-Match wins over If-Unmodified-Since.
        assert!(
            !o(|o| {
                o.if_match = Some(ETagMatch::Any);
                o.if_unmodified_since = Some(10);
            })
            .unwrap()
        );
        assert!(o(|o| o.if_unmodified_since = Some(10)).is_err());
        assert!(!o(|o| o.if_unmodified_since = Some(1000)).unwrap());
        assert!(o(|o| o.if_none_match = Some(ETagMatch::Strong("abc".into()))).unwrap());
        assert!(!o(|o| o.if_none_match = Some(ETagMatch::Strong("x".into()))).unwrap());
        // If-None-Match wins over If-Modified-Since.
        assert!(
            !o(|o| {
                o.if_none_match = Some(ETagMatch::Strong("x".into()));
                o.if_modified_since = Some(5000);
            })
            .unwrap()
        );
        assert!(o(|o| o.if_modified_since = Some(1000)).unwrap());
        assert!(!o(|o| o.if_modified_since = Some(999)).unwrap());
    }
}
