//! Checksums a request body must match: Content-MD5 and any `x-amz-checksum-*` the client sent, checked as
//! the body streams in.

use super::*;

/// Checksums a request body must match: Content-MD5 and any `x-amz-checksum-*` the client sent.
pub(super) struct BodyCheck {
    md5: s3s::crypto::Md5,
    checksum: s3s::checksum::ChecksumHasher,
    content_md5: Option<String>,
    expected: s3s::dto::Checksum,
    /// Verified trailing headers of a streaming (aws-chunked) upload, read once the body is consumed.
    trailers: Option<s3s::TrailingHeaders>,
    /// The length the request declared for the decoded body (`x-amz-decoded-content-length`), and the bytes
    /// seen so far: quota admission used the declared length, so the body must be exactly that long.
    declared: Option<u64>,
    seen: u64,
    /// The algorithm whose checksum is kept with the object: the one the request named or sent.
    kept: Option<StrataAlgorithm>,
    /// The checksum a streaming upload's `x-amz-trailer` promised: the body is refused when it ends without.
    promised: Option<StrataAlgorithm>,
}

/// What a verified body was: its hex MD5 and the checksum kept with it (algorithm, base64 value).
#[derive(Debug, Clone)]
pub(super) struct Verified {
    pub md5: String,
    pub checksum: Option<(StrataAlgorithm, String)>,
}

pub(super) use strata_types::ChecksumAlgorithm as StrataAlgorithm;

/// A hasher of `alg` alone.
pub(super) fn hasher_for(alg: StrataAlgorithm) -> s3s::checksum::ChecksumHasher {
    let mut h = s3s::checksum::ChecksumHasher::default();
    match alg {
        StrataAlgorithm::Crc32 => h.crc32 = Some(Default::default()),
        StrataAlgorithm::Crc32c => h.crc32c = Some(Default::default()),
        StrataAlgorithm::Crc64nvme => h.crc64nvme = Some(Default::default()),
        StrataAlgorithm::Sha1 => h.sha1 = Some(Default::default()),
        StrataAlgorithm::Sha256 => h.sha256 = Some(Default::default()),
    }
    h
}

/// `alg`'s value in a set of checksums.
pub(super) fn pick(c: &s3s::dto::Checksum, alg: StrataAlgorithm) -> Option<&String> {
    match alg {
        StrataAlgorithm::Crc32 => c.checksum_crc32.as_ref(),
        StrataAlgorithm::Crc32c => c.checksum_crc32c.as_ref(),
        StrataAlgorithm::Crc64nvme => c.checksum_crc64nvme.as_ref(),
        StrataAlgorithm::Sha1 => c.checksum_sha1.as_ref(),
        StrataAlgorithm::Sha256 => c.checksum_sha256.as_ref(),
    }
}

/// A set of checksums holding `value` for `alg` alone, with S3's type when `kind` is given.
pub(super) fn checksum_dto(
    alg: StrataAlgorithm,
    value: String,
    kind: Option<&str>,
) -> s3s::dto::Checksum {
    let mut c = s3s::dto::Checksum {
        checksum_type: kind.map(|k| ChecksumType::from(k.to_string())),
        ..Default::default()
    };
    match alg {
        StrataAlgorithm::Crc32 => c.checksum_crc32 = Some(value),
        StrataAlgorithm::Crc32c => c.checksum_crc32c = Some(value),
        StrataAlgorithm::Crc64nvme => c.checksum_crc64nvme = Some(value),
        StrataAlgorithm::Sha1 => c.checksum_sha1 = Some(value),
        StrataAlgorithm::Sha256 => c.checksum_sha256 = Some(value),
    }
    c
}

/// The stored checksum as the response fields (`checksum_crc32` ... and, where the output has it,
/// `checksum_type`).
macro_rules! checksum_fields {
    ($out:expr, $c:expr) => {{
        let c: s3s::dto::Checksum = $c;
        $out.checksum_crc32 = c.checksum_crc32;
        $out.checksum_crc32c = c.checksum_crc32c;
        $out.checksum_crc64nvme = c.checksum_crc64nvme;
        $out.checksum_sha1 = c.checksum_sha1;
        $out.checksum_sha256 = c.checksum_sha256;
        c.checksum_type
    }};
}
pub(super) use checksum_fields;

/// A full-object checksum as kept with an object.
pub(super) fn stored_full(alg: StrataAlgorithm, value: String) -> strata_types::StoredChecksum {
    strata_types::StoredChecksum {
        algorithm: alg,
        value,
        full_object: true,
        parts: Vec::new(),
    }
}

/// S3's composite checksum of parts whose checksums (base64) are `parts`: the checksum of their raw
/// concatenation, base64, then `-<count>`.
pub(super) fn composite(alg: StrataAlgorithm, parts: &[String]) -> S3Result<String> {
    let mut h = hasher_for(alg);
    for p in parts {
        let raw = base64_decode(p)
            .ok_or_else(|| s3_error!(InvalidPart, "a part's checksum is not valid base64"))?;
        h.update(&raw);
    }
    let v = pick(&h.finalize(), alg).cloned().unwrap_or_default();
    Ok(format!("{v}-{}", parts.len()))
}

/// Whether a multipart upload with `alg` keeps a full-object checksum, from its `x-amz-checksum-type`: as
/// S3, CRC64NVME is full-object only, SHA1 and SHA256 composite only, CRC32 and CRC32C composite unless asked.
pub(super) fn upload_checksum_type(
    alg: Option<StrataAlgorithm>,
    kind: Option<&ChecksumType>,
) -> S3Result<bool> {
    let asked = kind.map(|k| k.as_str().to_ascii_uppercase());
    let Some(alg) = alg else {
        return match asked {
            None => Ok(false),
            Some(_) => Err(s3_error!(
                InvalidRequest,
                "x-amz-checksum-type needs x-amz-checksum-algorithm"
            )),
        };
    };
    match (alg, asked.as_deref()) {
        (StrataAlgorithm::Crc64nvme, None | Some("FULL_OBJECT")) => Ok(true),
        (StrataAlgorithm::Crc64nvme, Some(_)) => Err(s3_error!(
            InvalidRequest,
            "CRC64NVME checksums of multipart uploads are FULL_OBJECT only"
        )),
        (_, None | Some("COMPOSITE")) => Ok(false),
        (a, Some("FULL_OBJECT")) if a.combines() => Ok(true),
        (a, Some(k)) => Err(s3_error!(
            InvalidRequest,
            "the checksum type {k} is not supported with {} for multipart uploads",
            a.as_str()
        )),
    }
}

/// S3's name of a checksum type.
pub(super) fn checksum_type_of(full_object: bool) -> ChecksumType {
    ChecksumType::from_static(if full_object {
        ChecksumType::FULL_OBJECT
    } else {
        ChecksumType::COMPOSITE
    })
}

/// The algorithm an upload or write request names (`x-amz-checksum-algorithm`, `x-amz-sdk-checksum-algorithm`).
pub(super) fn algorithm_of(a: Option<&ChecksumAlgorithm>) -> S3Result<Option<StrataAlgorithm>> {
    match a {
        None => Ok(None),
        Some(a) => StrataAlgorithm::parse(a.as_str()).map(Some).ok_or_else(|| {
            s3_error!(
                InvalidRequest,
                "unsupported checksum algorithm {}",
                a.as_str()
            )
        }),
    }
}

/// `x-amz-decoded-content-length` of a streaming (aws-chunked) request: the body's real length, which quota
/// admission charges and [`BodyCheck`] holds the body to. A value that is not a non-negative integer is an
/// error.
pub(super) fn decoded_length(headers: &http::HeaderMap) -> S3Result<Option<u64>> {
    match headers.get("x-amz-decoded-content-length") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&n| n <= i64::MAX as u64)
            .map(Some)
            .ok_or_else(|| {
                s3_error!(
                    InvalidArgument,
                    "x-amz-decoded-content-length must be a non-negative integer"
                )
            }),
    }
}

impl BodyCheck {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        content_md5: Option<String>,
        algorithm: Option<&ChecksumAlgorithm>,
        crc32: Option<String>,
        crc32c: Option<String>,
        sha1: Option<String>,
        sha256: Option<String>,
        crc64nvme: Option<String>,
    ) -> S3Result<Self> {
        let mut checksum = s3s::checksum::ChecksumHasher::default();
        let sent = [
            (StrataAlgorithm::Crc32, crc32.is_some()),
            (StrataAlgorithm::Crc32c, crc32c.is_some()),
            (StrataAlgorithm::Crc64nvme, crc64nvme.is_some()),
            (StrataAlgorithm::Sha1, sha1.is_some()),
            (StrataAlgorithm::Sha256, sha256.is_some()),
        ];
        let kept =
            algorithm_of(algorithm)?.or_else(|| sent.iter().find(|(_, on)| *on).map(|(a, _)| *a));
        if crc32.is_some() {
            checksum.crc32 = Some(Default::default());
        }
        if crc32c.is_some() {
            checksum.crc32c = Some(Default::default());
        }
        if sha1.is_some() {
            checksum.sha1 = Some(Default::default());
        }
        if sha256.is_some() {
            checksum.sha256 = Some(Default::default());
        }
        if crc64nvme.is_some() {
            checksum.crc64nvme = Some(Default::default());
        }
        if let Some(alg) = algorithm {
            match alg.as_str() {
                ChecksumAlgorithm::CRC32 => checksum.crc32 = Some(Default::default()),
                ChecksumAlgorithm::CRC32C => checksum.crc32c = Some(Default::default()),
                ChecksumAlgorithm::SHA1 => checksum.sha1 = Some(Default::default()),
                ChecksumAlgorithm::SHA256 => checksum.sha256 = Some(Default::default()),
                ChecksumAlgorithm::CRC64NVME => checksum.crc64nvme = Some(Default::default()),
                other => {
                    return Err(s3_error!(
                        NotImplemented,
                        "unsupported checksum algorithm {other}"
                    ));
                }
            }
        }
        Ok(Self {
            md5: s3s::crypto::Md5::new(),
            checksum,
            content_md5,
            expected: s3s::dto::Checksum {
                checksum_crc32: crc32,
                checksum_crc32c: crc32c,
                checksum_sha1: sha1,
                checksum_sha256: sha256,
                checksum_crc64nvme: crc64nvme,
                ..Default::default()
            },
            trailers: None,
            declared: None,
            seen: 0,
            kept,
            promised: None,
        })
    }

    /// Also compute (and keep) `alg`'s checksum: the algorithm of the multipart upload a part belongs to, or
    /// one a trailer declares (`x-amz-trailer`).
    pub(super) fn keeping(mut self, alg: Option<StrataAlgorithm>) -> Self {
        if let Some(alg) = alg {
            let h = hasher_for(alg);
            let c = &mut self.checksum;
            c.crc32 = c.crc32.take().or(h.crc32);
            c.crc32c = c.crc32c.take().or(h.crc32c);
            c.crc64nvme = c.crc64nvme.take().or(h.crc64nvme);
            c.sha1 = c.sha1.take().or(h.sha1);
            c.sha256 = c.sha256.take().or(h.sha256);
            self.kept = self.kept.or(Some(alg));
        }
        self
    }

    /// The kept checksum when the request gave its value up front (a header, not a trailer).
    pub(super) fn declared_checksum(&self) -> Option<strata_types::StoredChecksum> {
        let alg = self.kept?;
        Some(stored_full(alg, pick(&self.expected, alg)?.clone()))
    }

    /// [`Self::keeping`] the algorithm a streaming upload's `x-amz-trailer` declares.
    pub(super) fn keeping_trailer(self, headers: &http::HeaderMap) -> Self {
        let declared = headers
            .get("x-amz-trailer")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().strip_prefix("x-amz-checksum-"))
            .and_then(StrataAlgorithm::parse);
        let mut me = self.keeping(declared);
        me.promised = declared;
        me
    }

    pub(super) fn with_trailers(mut self, t: Option<s3s::TrailingHeaders>) -> Self {
        self.trailers = t;
        self
    }

    /// Hold the body to the decoded length its request declared (see [`Self::update`], [`Self::finish`]).
    pub(super) fn with_declared_length(mut self, n: Option<u64>) -> Self {
        self.declared = n;
        self
    }

    /// Take in the next chunk; an error as soon as the body is longer than it declared.
    pub(super) fn update(&mut self, b: &[u8]) -> S3Result<()> {
        self.seen += b.len() as u64;
        if let Some(n) = self.declared
            && self.seen > n
        {
            return Err(s3_error!(
                IncompleteBody,
                "the body is longer than the {n} bytes x-amz-decoded-content-length declares"
            ));
        }
        self.md5.update(b);
        self.checksum.update(b);
        Ok(())
    }

    /// Verify; returns the body's hex MD5 and the checksum kept with it. `trailers` are the verified trailing
    /// headers of a streaming upload.
    pub(super) fn finish(mut self) -> S3Result<Verified> {
        if let Some(n) = self.declared
            && self.seen != n
        {
            return Err(s3_error!(
                IncompleteBody,
                "the body is {} bytes; x-amz-decoded-content-length declares {n}",
                self.seen
            ));
        }
        let trailers = self.trailers.take().and_then(|t| t.take());
        let trailers = trailers.as_ref();
        let md5 = self.md5.finalize();
        if let Some(want) = &self.content_md5 {
            let want = base64_decode(want)
                .ok_or_else(|| s3_error!(InvalidDigest, "Content-MD5 is not valid base64"))?;
            if want != md5 {
                return Err(s3_error!(
                    BadDigest,
                    "the Content-MD5 you specified did not match what we received"
                ));
            }
        }
        if let Some(t) = trailers {
            let get = |name: &str| {
                t.get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            let e = &mut self.expected;
            e.checksum_crc32 = get("x-amz-checksum-crc32").or(e.checksum_crc32.take());
            e.checksum_crc32c = get("x-amz-checksum-crc32c").or(e.checksum_crc32c.take());
            e.checksum_sha1 = get("x-amz-checksum-sha1").or(e.checksum_sha1.take());
            e.checksum_sha256 = get("x-amz-checksum-sha256").or(e.checksum_sha256.take());
            e.checksum_crc64nvme = get("x-amz-checksum-crc64nvme").or(e.checksum_crc64nvme.take());
        }
        // A trailer that was promised and never came: the body is unchecked, so it is not stored.
        if let Some(alg) = self.promised
            && pick(&self.expected, alg).is_none()
        {
            return Err(s3_error!(
                InvalidRequest,
                "x-amz-trailer promised x-amz-checksum-{} but the body ended without it; nothing was stored",
                alg.as_str().to_ascii_lowercase()
            ));
        }
        let got = self.checksum.finalize();
        let pairs = [
            ("crc32", &got.checksum_crc32, &self.expected.checksum_crc32),
            (
                "crc32c",
                &got.checksum_crc32c,
                &self.expected.checksum_crc32c,
            ),
            ("sha1", &got.checksum_sha1, &self.expected.checksum_sha1),
            (
                "sha256",
                &got.checksum_sha256,
                &self.expected.checksum_sha256,
            ),
            (
                "crc64nvme",
                &got.checksum_crc64nvme,
                &self.expected.checksum_crc64nvme,
            ),
        ];
        for (name, got, want) in pairs {
            if let Some(want) = want
                && got.as_deref() != Some(want.as_str())
            {
                return Err(s3_error!(
                    BadDigest,
                    "x-amz-checksum-{name} did not match what we received"
                ));
            }
        }
        let checksum = self
            .kept
            .and_then(|a| pick(&got, a).map(|v| (a, v.clone())));
        Ok(Verified {
            md5: hex(&md5),
            checksum,
        })
    }
}

pub(super) fn base64_decode(s: &str) -> Option<Vec<u8>> {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let s = s.trim().trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = T.iter().position(|&t| t == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
