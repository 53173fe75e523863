//! Scan a directory tree and print the usage report as JSON (used by `bench/usage_scan_vs_du.py`).
//!
//! ```text
//! cargo run --release -p strata-quota --example usage_scan -- PATH [--threads N] [--project-depth N] [--cross-devices]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use strata_quota::scan::{ScanOptions, scan};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut opts = ScanOptions::default();
    let mut root: Option<PathBuf> = None;
    while let Some(arg) = args.next() {
        let number = |value: Option<String>| value.and_then(|v| v.parse::<usize>().ok());
        match arg.as_str() {
            "--threads" => match number(args.next()) {
                Some(n) => opts.threads = n,
                None => return usage("--threads needs a number"),
            },
            "--project-depth" => match number(args.next()) {
                Some(n) => opts.project_depth = n,
                None => return usage("--project-depth needs a number"),
            },
            "--cross-devices" => opts.one_file_system = false,
            _ if root.is_none() && !arg.starts_with("--") => root = Some(PathBuf::from(arg)),
            _ => return usage(&format!("unexpected argument {arg:?}")),
        }
    }
    let Some(root) = root else {
        return usage("missing PATH");
    };
    let report = match scan(&root, &opts) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("usage_scan: {e}");
            return ExitCode::FAILURE;
        }
    };
    match serde_json::to_string_pretty(&report) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("usage_scan: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!(
        "usage_scan: {why}\nusage: usage_scan PATH [--threads N] [--project-depth N] [--cross-devices]"
    );
    ExitCode::from(2)
}
