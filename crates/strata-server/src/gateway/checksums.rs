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
        })
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

    /// Verify; returns the body's hex MD5. `trailers` are the verified trailing headers of a streaming upload.
    pub(super) fn finish(mut self) -> S3Result<String> {
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
        Ok(hex(&md5))
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
