//! S3 reads and listings go through the proxy the environment names (`HTTP_PROXY`, `HTTPS_PROXY`,
//! `NO_PROXY`), as writes through `object_store`'s client do. A test binary of its own: it sets the process
//! environment.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use strata_object::{Backend, BackendOptions, PutMode, RetryPolicy};
use strata_telemetry::Telemetry;
use strata_testkit::{ACCESS_KEY, S3Server, SECRET_KEY};
use strata_types::IoContext;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A CONNECT proxy on loopback that counts the tunnels it opened.
async fn connect_proxy() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tunnels = Arc::new(AtomicUsize::new(0));
    let count = tunnels.clone();
    tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                return;
            };
            let count = count.clone();
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                let mut line = String::new();
                conn.read_line(&mut line).await.unwrap();
                let target = match line.split_whitespace().collect::<Vec<_>>()[..] {
                    ["CONNECT", target, _] => target.to_string(),
                    _ => return,
                };
                // The rest of the request head.
                loop {
                    let mut h = String::new();
                    conn.read_line(&mut h).await.unwrap();
                    if h == "\r\n" || h.is_empty() {
                        break;
                    }
                }
                let Ok(mut upstream) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let mut conn = conn.into_inner();
                conn.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    .await
                    .unwrap();
                let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
            });
        }
    });
    (format!("http://{addr}"), tunnels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_reads_and_listings_go_through_the_environments_proxy() {
    let server = S3Server::start();
    server.create_bucket("proxied").await;
    let opts = BackendOptions {
        endpoint: Some(server.endpoint()),
        region: Some("us-east-1".into()),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        ..Default::default()
    };
    let ctx = IoContext::default();
    let direct = Backend::open(
        "s3://proxied",
        &opts,
        RetryPolicy::default(),
        Telemetry::new(),
    )
    .unwrap();
    let data = Bytes::from(vec![7u8; 300_000]);
    direct
        .put(&ctx, "a/b.bin", data.clone(), PutMode::Overwrite)
        .await
        .unwrap();

    let (proxy, tunnels) = connect_proxy().await;
    // SAFETY: this test binary has one test; the only other threads (the runtime's, the proxy's tasks)
    // are waiting on sockets and never read the environment.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("HTTP_PROXY", &proxy);
        std::env::remove_var("NO_PROXY");
        std::env::remove_var("no_proxy");
    }
    let b = Backend::open(
        "s3://proxied",
        &opts,
        RetryPolicy::default(),
        Telemetry::new(),
    )
    .unwrap();
    assert_eq!(b.get(&ctx, "a/b.bin").await.unwrap().1, data);
    assert_eq!(b.head(&ctx, "a/b.bin").await.unwrap().size, 300_000);
    let page = b.list_page(&ctx, "a/", None, 10).await.unwrap();
    assert_eq!(page.objects.len(), 1);
    assert!(
        tunnels.load(Ordering::SeqCst) >= 1,
        "no request went through the proxy"
    );

    // NO_PROXY exempts the endpoint: connections go direct.
    // SAFETY: as above.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("NO_PROXY", "127.0.0.1")
    };
    let before = tunnels.load(Ordering::SeqCst);
    let exempt = Backend::open(
        "s3://proxied",
        &opts,
        RetryPolicy::default(),
        Telemetry::new(),
    )
    .unwrap();
    assert_eq!(exempt.get(&ctx, "a/b.bin").await.unwrap().1, data);
    assert_eq!(tunnels.load(Ordering::SeqCst), before);
}
