//! Serving the gateway: the accept loop with graceful shutdown ([`run`]), and the request-level scope check in
//! front of s3s (requests signed for another region or service are refused before anything is parsed).

use super::*;

/// Serve the gateway on `listener` until `stop` is cancelled, then let in-flight requests finish (up to
/// `grace`).
pub async fn run(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    stop: tokio_util::sync::CancellationToken,
    grace: std::time::Duration,
) {
    let auth = gateway.auth();
    let region = gateway.region.clone();
    let mut builder = s3s::service::S3ServiceBuilder::new(gateway);
    builder.set_auth(auth);
    let service = ScopeCheck {
        inner: builder.build(),
        region: Arc::from(region.as_str()),
    };
    let http = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut draining = None;
    loop {
        let socket = tokio::select! {
            r = listener.accept() => match r {
                Ok((socket, _)) => socket,
                Err(e) => {
                    tracing::warn!(error = %e, "gateway: accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            // Stopping: the connections already queued are served before the listener closes.
            _ = stop.cancelled() => match crate::drain::queued(
                &listener,
                *draining.get_or_insert_with(tokio::time::Instant::now),
            )
            .await
            {
                Some((socket, _)) => socket,
                None => break,
            },
        };
        let _ = socket.set_nodelay(true);
        let conn = http.serve_connection(hyper_util::rt::TokioIo::new(socket), service.clone());
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("gateway: requests still running after the grace period were cut off");
    }
}

/// Refuses, before s3s parses anything, requests signed for another region or service: `403
/// SignatureDoesNotMatch`, as for any signature that does not verify here. (s3s itself would answer 501 for an
/// unknown service.)
#[derive(Clone)]
pub(super) struct ScopeCheck {
    pub(super) inner: s3s::service::S3Service,
    pub(super) region: Arc<str>,
}

impl ScopeCheck {
    /// `(region, service)` from `Authorization: AWS4-HMAC-SHA256 Credential=AK/DATE/REGION/SERVICE/aws4_request`
    /// or from a presigned URL's `X-Amz-Credential`.
    fn scope(req: &http::Request<hyper::body::Incoming>) -> Option<(String, String)> {
        let from_cred = |c: &str| {
            let mut parts = c.split('/');
            let (_ak, _date) = (parts.next()?, parts.next()?);
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        };
        if let Some(auth) = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            && let Some(idx) = auth.find("Credential=")
        {
            let rest = &auth[idx + "Credential=".len()..];
            return from_cred(rest.split([',', ' ']).next().unwrap_or_default());
        }
        let query = req.uri().query()?;
        for pair in query.split('&') {
            if let Some(v) = pair.strip_prefix("X-Amz-Credential=") {
                let decoded = v.replace("%2F", "/").replace("%2f", "/");
                return from_cred(&decoded);
            }
        }
        None
    }
}

impl ScopeCheck {
    /// The first header of a SigV4 request that changes what the request does (a copy source, stored
    /// metadata, directives, encryption, ACLs, tagging, object lock, storage class, the decoded length quota
    /// admission charges) but is not among its signed headers: anyone on the path could add it to a signed
    /// or presigned request. SigV2 signs every `x-amz-*` header by construction.
    fn unsigned_acting_header(req: &http::Request<hyper::body::Incoming>) -> Option<String> {
        let from_auth = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .filter(|a| a.starts_with("AWS4-HMAC-SHA256"))
            .map(|a| {
                a.split_once("SignedHeaders=")
                    .map(|(_, rest)| {
                        rest.split([',', ' '])
                            .next()
                            .unwrap_or_default()
                            .to_string()
                    })
                    .unwrap_or_default()
            });
        let signed = from_auth.or_else(|| {
            url::form_urlencoded::parse(req.uri().query()?.as_bytes())
                .find(|(k, _)| k == "X-Amz-SignedHeaders")
                .map(|(_, v)| v.into_owned())
        })?;
        let signed: Vec<&str> = signed.split(';').collect();
        req.headers()
            .keys()
            .map(|k| k.as_str())
            .find(|name| acts(name) && !signed.contains(name))
            .map(str::to_string)
    }
}

/// Whether a request header (lower case) changes what an S3 request does.
/// The largest XML request body (DeleteObjects, CompleteMultipartUpload, bucket configuration) the gateway
/// reads; s3s's own limit, which it answers with a 500 when the body is streamed.
pub(crate) const XML_MAX_BODY: u64 = 20 << 20;

impl ScopeCheck {
    /// The declared length of an XML request body over [`XML_MAX_BODY`]: a POST (DeleteObjects,
    /// CompleteMultipartUpload) or a PUT of a sub-resource, not of object data (PutObject, UploadPart).
    fn xml_body_too_large(req: &http::Request<hyper::body::Incoming>) -> Option<u64> {
        let len = req
            .headers()
            .get(http::header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse::<u64>()
            .ok()?;
        if len <= XML_MAX_BODY {
            return None;
        }
        let data_param = |k: &str| {
            matches!(
                k,
                "partNumber" | "uploadId" | "x-id" | "AWSAccessKeyId" | "Signature" | "Expires"
            ) || k.to_ascii_lowercase().starts_with("x-amz-")
        };
        let subresource = req
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
            .any(|p| !data_param(p.split('=').next().unwrap_or_default()));
        let xml = req.method() == http::Method::POST
            || (req.method() == http::Method::PUT && subresource);
        xml.then_some(len)
    }
}

fn acts(name: &str) -> bool {
    const EXACT: [&str; 7] = [
        "x-amz-metadata-directive",
        "x-amz-tagging-directive",
        "x-amz-tagging",
        "x-amz-acl",
        "x-amz-storage-class",
        "x-amz-website-redirect-location",
        "x-amz-decoded-content-length",
    ];
    const PREFIXES: [&str; 6] = [
        "x-amz-meta-",
        "x-amz-copy-source",
        "x-amz-server-side-encryption",
        "x-amz-grant-",
        "x-amz-object-lock-",
        "x-amz-checksum-",
    ];
    EXACT.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for ScopeCheck {
    type Response = s3s::HttpResponse;
    type Error = s3s::HttpError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        // A request refused before its body was read (here, or a quota or ownership refusal that answers
        // before the body is accepted) leaves body bytes on the connection: close it after the answer, so the
        // client's next request is never parsed from what is left of this one's body.
        let has_body = req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
            || req.headers().contains_key(http::header::TRANSFER_ENCODING);
        // `Expect: 100-continue` on an empty body: hyper answers without a `100 Continue` (there is no body to
        // ask for), which botocore takes as an early final answer and then misreads the next response on the
        // connection, stalling for its read timeout (the aws cli uploading empty files). The connection is
        // closed after this answer instead, so the client's next request starts clean.
        let empty_expect = !has_body
            && req
                .headers()
                .get(http::header::EXPECT)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let refusal = if let Some((region, service)) = Self::scope(&req)
            && (region != *self.region || service != "s3")
        {
            Some((
                http::StatusCode::FORBIDDEN,
                "SignatureDoesNotMatch",
                format!(
                    "the request is signed for region {region:?} and service {service:?}; this gateway is {:?}, \
                     service \"s3\"",
                    self.region
                ),
            ))
        } else if let Some(name) = Self::unsigned_acting_header(&req) {
            Some((
                http::StatusCode::FORBIDDEN,
                "AccessDenied",
                format!(
                    "the header {name} changes what this request does and must be signed (add it to SignedHeaders)"
                ),
            ))
        } else if let Err(e) = super::presign_expiry_allowed(req.uri().query()) {
            let denied = *e.code() == s3s::S3ErrorCode::AccessDenied;
            Some((
                if denied {
                    http::StatusCode::FORBIDDEN
                } else {
                    http::StatusCode::BAD_REQUEST
                },
                if denied {
                    "AccessDenied"
                } else {
                    "AuthorizationQueryParametersError"
                },
                e.message().unwrap_or_default().to_string(),
            ))
        } else {
            Self::xml_body_too_large(&req).map(|len| {
                (
                    http::StatusCode::BAD_REQUEST,
                    "MaxMessageLengthExceeded",
                    format!(
                        "the request's XML body is {len} bytes; at most {XML_MAX_BODY} are accepted"
                    ),
                )
            })
        };
        // Every response names its request; failures are logged under the same id.
        let id = format!("{:016X}", rand::random::<u64>());
        if let Some((status, code, message)) = refusal {
            // Refused before s3s parses the request.
            let mut resp = refused(status, code, &message, &id);
            if !has_body {
                resp.headers_mut().remove(http::header::CONNECTION);
            }
            return Box::pin(futures::future::ready(Ok(resp)));
        }
        // `Transfer-Encoding: chunked` without a length (curl -T -, a pipe), which S3 takes and s3s refuses:
        // read whole, within a bound, and given its length.
        let unsized_body = !req.headers().contains_key(http::header::CONTENT_LENGTH)
            && req
                .headers()
                .get(http::header::TRANSFER_ENCODING)
                .is_some_and(|v| {
                    v.to_str()
                        .is_ok_and(|v| v.to_ascii_lowercase().contains("chunked"))
                })
            && !req
                .headers()
                .get("x-amz-content-sha256")
                .is_some_and(|v| v.as_bytes().starts_with(b"STREAMING-"));
        // GetObjectAttributes: S3 sends the ETag there bare; s3s writes every ETag quoted.
        let object_attributes = req.method() == http::Method::GET
            && req.uri().query().is_some_and(|q| {
                q.split('&')
                    .any(|p| p == "attributes" || p.starts_with("attributes="))
            });
        let inner = self.inner.clone();
        let rid = id.clone();
        let fut = super::REQUEST_ID.scope(id.clone(), async move {
            if !unsized_body {
                return inner.call(req.map(s3s::Body::from)).await;
            }
            let (mut parts, body) = req.into_parts();
            let Ok(_permit) = UNSIZED_BODIES.acquire().await else {
                return Ok(refused(http::StatusCode::SERVICE_UNAVAILABLE, "SlowDown", "Please reduce your request rate.", &rid));
            };
            match s3s::Body::from(body).store_all_limited(UNSIZED_BODY_MAX).await {
                Ok(bytes) => {
                    parts
                        .headers
                        .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(bytes.len()));
                    inner
                        .call(http::Request::from_parts(parts, s3s::Body::from(bytes)))
                        .await
                }
                Err(_) => Ok(refused(
                    http::StatusCode::PAYLOAD_TOO_LARGE,
                    "EntityTooLarge",
                    &format!(
                        "a body sent without Content-Length is read whole first, and is at most {} MiB; send its Content-Length (or use a multipart upload)",
                        UNSIZED_BODY_MAX >> 20
                    ),
                    &rid,
                )),
            }
        });
        Box::pin(async move {
            let mut resp = fut.await?;
            if let Ok(v) = http::HeaderValue::from_str(&id) {
                resp.headers_mut().insert("x-amz-request-id", v);
            }
            // An error s3s answered before the request reached the gateway (a missing Content-Length, a
            // malformed header) carries the request id in its body too, as every other error.
            let failed = resp.status().is_client_error() || resp.status().is_server_error();
            if object_attributes
                && !failed
                && let Some(b) = resp.body().bytes()
                && let Ok(text) = std::str::from_utf8(&b)
            {
                let bare = bare_etags(text);
                resp.headers_mut().remove(http::header::CONTENT_LENGTH);
                *resp.body_mut() = s3s::Body::from(bare);
            }
            if failed
                && let Some(b) = resp.body().bytes()
                && let Some(with_id) = with_request_id(&b, &id)
            {
                resp.headers_mut().remove(http::header::CONTENT_LENGTH);
                *resp.body_mut() = s3s::Body::from(with_id);
            }
            if empty_expect
                || (has_body
                    && (resp.status().is_client_error() || resp.status().is_server_error()))
            {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            Ok(resp)
        })
    }
}

/// An S3 error body without a `<RequestId>`, with `id` as one (`None`: not such a body).
fn with_request_id(body: &[u8], id: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    if !text.contains("<Error>") || text.contains("<RequestId>") || body.len() > 64 * 1024 {
        return None;
    }
    let end = text.rfind("</Error>")?;
    Some(format!(
        "{}<RequestId>{id}</RequestId>{}",
        &text[..end],
        &text[end..]
    ))
}

/// The most of a body sent without a length (chunked) that the gateway reads before handing it on.
const UNSIZED_BODY_MAX: usize = 64 * 1024 * 1024;
/// How many such bodies are read at once (so at most 4 × 64 MiB are held).
static UNSIZED_BODIES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// An S3 error answer made here, with the request's id, closing the connection (its body may be unread).
fn refused(status: http::StatusCode, code: &str, message: &str, id: &str) -> s3s::HttpResponse {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{}</Message><RequestId>{id}</RequestId></Error>",
        message
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    );
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/xml")
        .header("x-amz-request-id", id)
        .header(http::header::CONNECTION, "close")
        .body(s3s::Body::from(body))
        .unwrap_or_default()
}

/// An XML answer with its `<ETag>` elements unquoted (`"abc"` or `&quot;abc&quot;` become `abc`).
fn bare_etags(xml: &str) -> String {
    let mut out = String::with_capacity(xml.len());
    let mut rest = xml;
    while let Some(i) = rest.find("<ETag>") {
        let (head, tail) = rest.split_at(i + "<ETag>".len());
        out.push_str(head);
        let Some(end) = tail.find("</ETag>") else {
            rest = tail;
            break;
        };
        let v = &tail[..end];
        let v = v
            .strip_prefix("&quot;")
            .and_then(|v| v.strip_suffix("&quot;"))
            .or_else(|| v.strip_prefix('"').and_then(|v| v.strip_suffix('"')))
            .unwrap_or(v);
        out.push_str(v);
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}
