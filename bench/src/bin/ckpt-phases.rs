//! Where the time of a local checkpoint save goes: hashing, writing, fsync. Prints seconds per phase for a
//! state of N MiB (default 512) in 8 MiB tensors, against a plain write + fsync of the same bytes.
//!
//!     target/release/ckpt-phases [MIB] [DIR]

use std::io::Write;
use std::time::Instant;

use bytes::Bytes;
use strata_ckpt::{Tensor, Tier};
use strata_types::IoContext;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(512);
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "/tmp/ckpt-phases".into()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create dir");
    let tensors: Vec<Tensor> = (0..mib / 8)
        .map(|i| Tensor {
            name: format!("w{i}"),
            dtype: "U8".into(),
            shape: vec![8 << 20],
            data: Bytes::from(vec![i as u8; 8 << 20]),
        })
        .collect();
    let t = Instant::now();
    let mut h = blake3::Hasher::new();
    for x in &tensors {
        h.update(&x.data);
    }
    println!("blake3            {:.3} s", t.elapsed().as_secs_f64());
    let (header, _) =
        strata_ckpt::format::encode_header(&tensors, &Default::default()).expect("header");
    let tier = Tier::Local(dir.clone());
    let t = Instant::now();
    tier.write_shard(&IoContext::default(), "run", 1, 0, &header, &tensors)
        .await
        .expect("shard");
    println!("write_shard       {:.3} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    {
        let mut f = std::fs::File::create(dir.join("raw")).expect("create");
        for x in &tensors {
            f.write_all(&x.data).expect("write");
        }
        let w = t.elapsed().as_secs_f64();
        f.sync_all().expect("fsync");
        println!(
            "write + fsync     {:.3} s (write {w:.3})",
            t.elapsed().as_secs_f64()
        );
    }
}
