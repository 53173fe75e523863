//! S3 multipart uploads staged on local disk.
//!
//! Parts arrive in any order, may be re-sent, and the upload may be abandoned; none of that may become visible
//! at the backend. So parts are staged under `<data_dir>/uploads/<upload id>/` (each written to a temporary
//! name, then renamed to `part-NNNNN.<md5>`), and only `CompleteMultipartUpload` sends the object to the backend,
//! as one backend multipart upload that becomes visible atomically. A killed gateway leaves staged parts, which a
//! retried complete or abort uses or removes, and which the agent deletes at start once older than
//! [`STALE_AFTER`].
//!
//! An upload belongs to the access key that created it (another key gets `AccessDenied`), and to one bucket
//! and key. Its `upload.json` keeps the attributes given to CreateMultipartUpload for the completed object.
//! Complete checks the part order, their ETags and the 5 MiB minimum of every part but the last before
//! anything is sent.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use strata_types::{ChecksumAlgorithm, Error, ErrorKind, ObjectAttrs, Result};

/// Staged uploads untouched for this long are removed when the agent starts.
pub const STALE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// What `CreateMultipartUpload` recorded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UploadInfo {
    /// Bucket (configured backend name).
    pub bucket: String,
    /// Object key.
    pub key: String,
    /// Access key that created the upload; only it may use the upload.
    pub owner: String,
    /// Attributes to keep with the object (Content-Type, user metadata).
    #[serde(default)]
    pub attrs: ObjectAttrs,
    /// The checksum algorithm the upload was created with (`x-amz-checksum-algorithm`): every part's is
    /// kept, and the object's is computed from them on complete.
    #[serde(default)]
    pub checksum: Option<ChecksumAlgorithm>,
    /// `x-amz-checksum-type: FULL_OBJECT` (a CRC of all the bytes) rather than `COMPOSITE`.
    #[serde(default)]
    pub full_object: bool,
}

/// One staged part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedPart {
    /// 1..=10000.
    pub number: i32,
    /// Hex MD5 of the part (its ETag).
    pub md5: String,
    /// Size in bytes.
    pub size: u64,
    /// Path of the staged file.
    pub path: PathBuf,
    /// Modification time.
    pub modified: SystemTime,
    /// The part's checksum (base64) with the upload's algorithm, when the upload has one.
    pub checksum: Option<(ChecksumAlgorithm, String)>,
}

/// What a completed upload leaves for a repeated `CompleteMultipartUpload` (a client retrying after a lost
/// answer): the same request, by the same key, gets the same answer, for [`STALE_AFTER`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Completed {
    pub bucket: String,
    pub key: String,
    pub owner: String,
    /// Part numbers and ETags as the completing request listed them.
    pub parts: Vec<(i32, String)>,
    /// The ETag the object was completed with.
    pub etag: String,
    /// The checksum it was completed with.
    #[serde(default)]
    pub checksum: Option<strata_types::StoredChecksum>,
}

/// The staging area.
#[derive(Debug, Clone)]
pub struct Staging {
    root: PathBuf,
}

fn io(e: std::io::Error, what: impl std::fmt::Display) -> Error {
    Error::from_io(e, what)
}

impl Staging {
    /// Open (create) the staging area and remove stale uploads and partial parts.
    pub fn open(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root).map_err(|e| io(e, format!("creating {}", root.display())))?;
        if let Ok(rd) = std::fs::read_dir(root) {
            for up in rd.flatten() {
                let p = up.path();
                if up.file_name() == "completed" {
                    for f in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                        let old = f
                            .metadata()
                            .and_then(|m| m.modified())
                            .ok()
                            .and_then(|t| t.elapsed().ok())
                            .is_some_and(|age| age > STALE_AFTER);
                        if old {
                            let _ = std::fs::remove_file(f.path());
                        }
                    }
                    continue;
                }
                let stale = up
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE_AFTER);
                if stale {
                    let _ = std::fs::remove_dir_all(&p);
                    continue;
                }
                if let Ok(parts) = std::fs::read_dir(&p) {
                    for f in parts.flatten() {
                        if f.file_name().to_string_lossy().ends_with(".tmp") {
                            let _ = std::fs::remove_file(f.path());
                        }
                    }
                }
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    fn dir(&self, upload_id: &str) -> Result<PathBuf> {
        let valid = upload_id.len() == 32 && upload_id.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("no such upload {upload_id:?}"),
            ));
        }
        Ok(self.root.join(upload_id))
    }

    /// Start an upload; returns its id.
    pub fn create(&self, info: &UploadInfo) -> Result<String> {
        let id: String = (0..16)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        let dir = self.dir(&id)?;
        std::fs::create_dir_all(&dir).map_err(|e| io(e, format!("creating {}", dir.display())))?;
        let body = serde_json::to_vec(info).map_err(|e| Error::internal(e.to_string()))?;
        std::fs::write(dir.join("upload.json"), body).map_err(|e| io(e, "writing upload.json"))?;
        Ok(id)
    }

    /// The upload's record; `NotFound` if it does not exist (completed, aborted or never created).
    pub fn info(&self, upload_id: &str) -> Result<UploadInfo> {
        let dir = self.dir(upload_id)?;
        let body = std::fs::read(dir.join("upload.json")).map_err(|_| {
            Error::new(ErrorKind::NotFound, format!("no such upload {upload_id:?}"))
        })?;
        serde_json::from_slice(&body)
            .map_err(|e| Error::new(ErrorKind::Corrupt, format!("upload {upload_id}: {e}")))
    }

    /// A temporary path for a part being received.
    pub fn temp_part_path(&self, upload_id: &str, number: i32) -> Result<PathBuf> {
        let seq: u64 = rand::random();
        Ok(self
            .dir(upload_id)?
            .join(format!("part-{number:05}.{seq:016x}.tmp")))
    }

    /// Publish a received part (replacing an earlier copy of the same part number): named
    /// `part-NNNNN.<md5>[.<algorithm>.<base64 checksum, '/' as '_'>]`.
    pub fn commit_part(
        &self,
        upload_id: &str,
        number: i32,
        tmp: &Path,
        md5: &str,
        checksum: Option<&(ChecksumAlgorithm, String)>,
    ) -> Result<()> {
        let dir = self.dir(upload_id)?;
        for old in self
            .parts(upload_id)?
            .into_iter()
            .filter(|p| p.number == number)
        {
            let _ = std::fs::remove_file(old.path);
        }
        let sum = checksum
            .map(|(a, v)| format!(".{}.{}", a.as_str(), v.replace('/', "_")))
            .unwrap_or_default();
        let dst = dir.join(format!("part-{number:05}.{md5}{sum}"));
        std::fs::rename(tmp, &dst).map_err(|e| io(e, format!("publishing {}", dst.display())))
    }

    /// Staged parts, by part number.
    pub fn parts(&self, upload_id: &str) -> Result<Vec<StagedPart>> {
        let dir = self.dir(upload_id)?;
        let rd = std::fs::read_dir(&dir).map_err(|_| {
            Error::new(ErrorKind::NotFound, format!("no such upload {upload_id:?}"))
        })?;
        let mut parts = Vec::new();
        for f in rd.flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("part-") else {
                continue;
            };
            if rest.ends_with(".tmp") {
                continue;
            }
            let mut fields = rest.split('.');
            let (Some(num), Some(md5)) = (fields.next(), fields.next()) else {
                continue;
            };
            let checksum = match (fields.next(), fields.next()) {
                (Some(a), Some(v)) => ChecksumAlgorithm::parse(a).map(|a| (a, v.replace('_', "/"))),
                _ => None,
            };
            let (Ok(number), Ok(meta)) = (num.parse::<i32>(), f.metadata()) else {
                continue;
            };
            parts.push(StagedPart {
                number,
                md5: md5.to_string(),
                size: meta.len(),
                path: f.path(),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                checksum,
            });
        }
        parts.sort_by_key(|p| p.number);
        Ok(parts)
    }

    /// Every upload in progress: its id, record and when it was created, by key, then creation.
    pub fn list(&self) -> Vec<(String, UploadInfo, SystemTime)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(id) = e.file_name().into_string() else {
                continue;
            };
            let (Ok(info), Ok(meta)) = (
                self.info(&id),
                std::fs::metadata(e.path().join("upload.json")),
            ) else {
                continue;
            };
            let created = meta
                .created()
                .or_else(|_| meta.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            out.push((id, info, created));
        }
        out.sort_by(|a, b| (&a.1.key, a.2, &a.0).cmp(&(&b.1.key, b.2, &b.0)));
        out
    }

    fn completed_path(&self, upload_id: &str) -> Result<PathBuf> {
        self.dir(upload_id)?;
        Ok(self
            .root
            .join("completed")
            .join(format!("{upload_id}.json")))
    }

    /// Keep what the upload was completed with (before its parts are removed).
    pub fn record_completed(&self, upload_id: &str, c: &Completed) -> Result<()> {
        let path = self.completed_path(upload_id)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| io(e, format!("creating {}", dir.display())))?;
        }
        let body = serde_json::to_vec(c).map_err(|e| Error::internal(e.to_string()))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, body).map_err(|e| io(e, format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(|e| io(e, format!("publishing {}", path.display())))
    }

    /// What the upload was completed with, if it was (within [`STALE_AFTER`]).
    pub fn completed(&self, upload_id: &str) -> Option<Completed> {
        let body = std::fs::read(self.completed_path(upload_id).ok()?).ok()?;
        serde_json::from_slice(&body).ok()
    }

    /// Forget the upload and its parts.
    pub fn remove(&self, upload_id: &str) -> Result<()> {
        let dir = self.dir(upload_id)?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::new(
                ErrorKind::NotFound,
                format!("no such upload {upload_id:?}"),
            )),
            Err(e) => Err(io(e, format!("removing {}", dir.display()))),
        }
    }
}
