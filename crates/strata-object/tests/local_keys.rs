//! A local-directory backend against a reference model (a map of key → bytes), with generated keys: every
//! key S3 allows is stored and read back, listings (recursive, paged, delimited) show exactly the model's
//! keys, and nothing is ever written outside the directory. Keys come from segments chosen to collide:
//! objects that are also prefixes (`a` and `a/b`), trailing `/`, `#digits`, `.`, `..`, empty segments.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;
use strata_object::{Backend, BackendOptions, PutMode, RetryPolicy};
use strata_telemetry::Telemetry;
use strata_types::IoContext;

#[derive(Debug, Clone)]
enum Op {
    Put(String, u8),
    Delete(String),
    Copy(String, String),
}

fn key() -> impl Strategy<Value = String> {
    let seg = prop::sample::select(vec![
        "a",
        "b",
        "a#1",
        ".",
        "..",
        "",
        "x y+%",
        "é",
        ".strata-keys",
    ]);
    (prop::collection::vec(seg, 1..4), any::<bool>()).prop_map(|(segs, slash)| {
        let mut k = segs.join("/");
        if slash || k.is_empty() {
            k.push('/');
        }
        k
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (key(), any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => key().prop_map(Op::Delete),
        1 => (key(), key()).prop_map(|(a, b)| Op::Copy(a, b)),
    ]
}

fn grouped(model: &BTreeMap<String, Vec<u8>>, prefix: &str) -> (Vec<String>, Vec<String>) {
    let (mut objects, mut prefixes) = (Vec::new(), Vec::new());
    for k in model.keys().filter(|k| k.starts_with(prefix)) {
        match k[prefix.len()..].find('/') {
            Some(i) => prefixes.push(k[..prefix.len() + i + 1].to_string()),
            None => objects.push(k.clone()),
        }
    }
    prefixes.dedup();
    (objects, prefixes)
}

async fn check(b: &Backend, model: &BTreeMap<String, Vec<u8>>, outside: &std::path::Path) {
    let c = IoContext::default();
    for (k, v) in model {
        let (meta, got) = b.get(&c, k).await.unwrap();
        assert_eq!(&got[..], &v[..], "{k:?}");
        assert_eq!(meta.key, *k);
        assert_eq!(b.head(&c, k).await.unwrap().size, v.len() as u64, "{k:?}");
    }
    let all: Vec<String> = b
        .list_page(&c, "", None, usize::MAX)
        .await
        .unwrap()
        .objects
        .into_iter()
        .map(|m| m.key)
        .collect();
    assert_eq!(all, model.keys().cloned().collect::<Vec<_>>());
    // Paged, two at a time.
    let (mut paged, mut after) = (Vec::new(), None::<String>);
    loop {
        let p = b.list_page(&c, "", after.as_deref(), 2).await.unwrap();
        paged.extend(p.objects.into_iter().map(|m| m.key));
        match p.next_start_after {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(paged, all);
    for prefix in ["", "a/", "a", "./", "../", "a/../", "é/", ".strata-keys/"] {
        let want: Vec<String> = model
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        let got: Vec<String> = b
            .list_page(&c, prefix, None, usize::MAX)
            .await
            .unwrap()
            .objects
            .into_iter()
            .map(|m| m.key)
            .collect();
        assert_eq!(got, want, "prefix {prefix:?}");
        let d = b.list_delimited(&c, prefix).await.unwrap();
        let (objects, prefixes) = grouped(model, prefix);
        assert_eq!(
            d.objects.into_iter().map(|m| m.key).collect::<Vec<_>>(),
            objects,
            "delimited {prefix:?}"
        );
        assert_eq!(d.common_prefixes, prefixes, "delimited prefixes {prefix:?}");
    }
    // Nothing beside the backend's root.
    let beside: Vec<_> = std::fs::read_dir(outside).unwrap().collect();
    assert_eq!(beside.len(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_local_directory_holds_every_key_as_a_map_does(ops in prop::collection::vec(op(), 1..24)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("file://{}/root", dir.path().display());
            let b = Backend::open(&url, &BackendOptions::default(), RetryPolicy::default(), Telemetry::new())
                .unwrap();
            let c = IoContext::default();
            let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Put(k, v) => {
                        let body = vec![v; (v as usize % 7) + 1];
                        b.put(&c, &k, Bytes::from(body.clone()), PutMode::Overwrite).await.unwrap();
                        model.insert(k, body);
                    }
                    Op::Delete(k) => {
                        b.delete(&c, &k).await.unwrap();
                        model.remove(&k);
                    }
                    Op::Copy(from, to) => {
                        let r = b.copy(&c, &from, &to).await;
                        match model.get(&from).cloned() {
                            Some(v) => {
                                r.unwrap();
                                model.insert(to, v);
                            }
                            None => assert!(r.is_err(), "copy of a missing key {from:?}"),
                        }
                    }
                }
                check(&b, &model, dir.path()).await;
            }
        });
    }
}
