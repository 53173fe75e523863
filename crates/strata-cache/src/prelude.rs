//! The names every room of the cache uses (standard library, tokio, futures, bytes, Strata's types, and the
//! crate's own tiers and policy), imported once: each module says `use crate::prelude::*`.

#![allow(unused_imports)]

pub(crate) use bytes::{Bytes, BytesMut};
pub(crate) use futures::future::{BoxFuture, Shared};
pub(crate) use futures::{FutureExt, StreamExt, TryStreamExt};
pub(crate) use parking_lot::{Mutex, RwLock};
pub(crate) use serde::{Deserialize, Serialize};
pub(crate) use std::collections::HashMap;
pub(crate) use std::ops::Range;
pub(crate) use std::path::PathBuf;
pub(crate) use std::sync::Arc;
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
pub(crate) use std::time::{Instant, SystemTime};
pub(crate) use strata_object::Backend;
pub(crate) use strata_telemetry::Telemetry;
pub(crate) use strata_types::{
    BlockKey, Error, ErrorKind, IoContext, IoEvent, ObjectId, ObjectMeta, Op, Outcome, Result, Tier,
};
pub(crate) use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
pub(crate) use tokio_util::sync::CancellationToken;
pub(crate) use tokio_util::task::TaskTracker;

pub(crate) use crate::config::{CacheConfig, DiskConfig, LOCAL_METADATA_TTL_MAX_MS};
pub(crate) use crate::disk::DiskTier;
pub(crate) use crate::policy::{Digest, DigestMap, Policy};
pub(crate) use crate::pool::BlockPool;
