//! Tests of the parallel usage scan against a single-threaded reference walk and against `du -s -B1`.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;

use strata_quota::scan::{MAX_ERRORS, NO_PROJECT, ScanOptions, ScanReport, UsageTotals, scan};
use strata_types::ErrorKind;

fn write(path: &Path, len: usize) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("mkdir");
    }
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    fs::write(path, data).expect("write");
}

/// A small tree with everything the scan must get right:
///
/// ```text
/// top.txt                    300 B, outside any project
/// alpha/a.bin                10 KiB
/// alpha/deep/b.bin           5000 B
/// alpha/deep/empty           0 B
/// alpha/deep/sparse          1 MiB apparent, no blocks
/// alpha/usr -> /usr          symlink to a big directory: must not be followed
/// alpha/loop -> .            symlink loop
/// beta/c.bin                 100 KiB
/// beta/c.hard                hard link to beta/c.bin
/// beta/a.hard                hard link to alpha/a.bin (across projects)
/// beta/a.sym -> ../alpha/a.bin
/// gamma/                     empty project
/// ```
fn small_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(&root.join("top.txt"), 300);
    write(&root.join("alpha/a.bin"), 10 * 1024);
    write(&root.join("alpha/deep/b.bin"), 5000);
    write(&root.join("alpha/deep/empty"), 0);
    fs::File::create(root.join("alpha/deep/sparse"))
        .and_then(|f| f.set_len(1 << 20))
        .expect("sparse");
    symlink("/usr", root.join("alpha/usr")).expect("symlink");
    symlink(".", root.join("alpha/loop")).expect("symlink");
    write(&root.join("beta/c.bin"), 100 * 1024);
    fs::hard_link(root.join("beta/c.bin"), root.join("beta/c.hard")).expect("link");
    fs::hard_link(root.join("alpha/a.bin"), root.join("beta/a.hard")).expect("link");
    symlink("../alpha/a.bin", root.join("beta/a.sym")).expect("symlink");
    fs::create_dir(root.join("gamma")).expect("mkdir");
    dir
}

/// A plain recursive walk: what the parallel scan must agree with.
fn reference(root: &Path) -> UsageTotals {
    fn visit(path: &Path, seen: &mut HashSet<(u64, u64)>, t: &mut UsageTotals) {
        let md = fs::symlink_metadata(path).expect("lstat");
        if !md.is_dir() && md.nlink() > 1 && !seen.insert((md.dev(), md.ino())) {
            return;
        }
        t.bytes += md.blocks() * 512;
        t.apparent_bytes += md.size();
        if md.is_dir() {
            t.dirs += 1;
            for entry in fs::read_dir(path).expect("read_dir") {
                visit(&entry.expect("entry").path(), seen, t);
            }
        } else {
            t.files += 1;
            t.file_bytes += md.size();
        }
    }
    let mut t = UsageTotals::default();
    visit(root, &mut HashSet::new(), &mut t);
    t
}

/// `du -s -B1 PATH`, in bytes.
fn du(root: &Path) -> u64 {
    let out = Command::new("du")
        .args(["-s", "-B1"])
        .arg(root)
        .output()
        .expect("run du");
    assert!(
        out.status.success(),
        "du failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected du output {text:?}"))
}

fn scan_with(root: &Path, threads: usize) -> ScanReport {
    let opts = ScanOptions {
        threads,
        ..ScanOptions::default()
    };
    scan(root, &opts).expect("scan")
}

fn sum(totals: impl IntoIterator<Item = UsageTotals>) -> UsageTotals {
    totals
        .into_iter()
        .fold(UsageTotals::default(), |mut acc, t| {
            acc.bytes += t.bytes;
            acc.apparent_bytes += t.apparent_bytes;
            acc.file_bytes += t.file_bytes;
            acc.files += t.files;
            acc.dirs += t.dirs;
            acc
        })
}

#[test]
fn totals_match_a_reference_walk_and_du() {
    let tree = small_tree();
    let root = tree.path();
    let want = reference(root);
    let du_bytes = du(root);
    assert_eq!(
        want.bytes, du_bytes,
        "the reference walk itself disagrees with du"
    );
    for threads in [0, 1, 2, 4, 8] {
        let report = scan_with(root, threads);
        assert_eq!(report.total, want, "threads = {threads}");
        assert_eq!(report.total.bytes, du_bytes, "threads = {threads}");
        assert!(
            report.errors.is_empty() && report.errors_total == 0,
            "{:?}",
            report.errors
        );
    }
    // 4 directories below the root plus the root; top.txt, a.bin, b.bin, empty, sparse, 2 symlinks in alpha,
    // c.bin, a.sym: the two hard links are not counted again.
    assert_eq!(want.dirs, 5);
    assert_eq!(want.files, 9);
    // The sparse file adds 1 MiB of apparent size but (almost) nothing allocated.
    assert!(
        want.apparent_bytes > (1 << 20) && want.bytes < (1 << 20),
        "{want:?}"
    );
}

#[test]
fn projects_and_owners_add_up() {
    let tree = small_tree();
    let root = tree.path();
    let report = scan_with(root, 2);
    let uid = fs::metadata(root).expect("stat").uid();
    assert_eq!(
        report.by_owner.keys().copied().collect::<Vec<_>>(),
        vec![uid]
    );
    assert_eq!(report.by_owner[&uid], report.total);

    let keys: Vec<&str> = report.by_project.keys().map(String::as_str).collect();
    assert_eq!(keys, vec![NO_PROJECT, "alpha", "beta", "gamma"]);
    assert_eq!(sum(report.by_project.values().copied()), report.total);
    // "." holds the root directory and top.txt.
    let top = report.by_project[NO_PROJECT];
    let size = |p: &str| fs::symlink_metadata(root.join(p)).expect("stat").size();
    assert_eq!(
        (top.dirs, top.files, top.apparent_bytes),
        (1, 1, size("") + 300),
        "{top:?}"
    );
    // An empty project is just its directory.
    let gamma = report.by_project["gamma"];
    assert_eq!(
        (gamma.dirs, gamma.files, gamma.apparent_bytes),
        (1, 0, size("gamma")),
        "{gamma:?}"
    );
    assert_eq!(report.by_project["alpha"].dirs, 2);
    // Each project matches du run on it, except for a.bin, hard-linked from both and counted in one.
    let (alpha, beta) = (report.by_project["alpha"], report.by_project["beta"]);
    let a_bin = fs::metadata(root.join("alpha/a.bin"))
        .expect("stat")
        .blocks()
        * 512;
    let (du_alpha, du_beta) = (du(&root.join("alpha")), du(&root.join("beta")));
    assert!(
        (alpha.bytes == du_alpha && beta.bytes == du_beta - a_bin)
            || (alpha.bytes == du_alpha - a_bin && beta.bytes == du_beta),
        "alpha {} (du {du_alpha}), beta {} (du {du_beta}), a.bin {a_bin}",
        alpha.bytes,
        beta.bytes
    );

    // Projects two levels down: alpha/deep is one, alpha's own files are not in any.
    let opts = ScanOptions {
        project_depth: 2,
        ..ScanOptions::default()
    };
    let report = scan(root, &opts).expect("scan");
    let keys: Vec<&str> = report.by_project.keys().map(String::as_str).collect();
    assert_eq!(keys, vec![NO_PROJECT, "alpha/deep"]);
    assert_eq!(report.by_project["alpha/deep"].files, 3);
    assert_eq!(sum(report.by_project.values().copied()), report.total);

    let opts = ScanOptions {
        project_depth: 0,
        ..ScanOptions::default()
    };
    let report = scan(root, &opts).expect("scan");
    assert_eq!(
        report.by_project,
        BTreeMap::from([(NO_PROJECT.to_string(), report.total)])
    );
}

#[test]
fn hard_links_are_counted_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(&root.join("p/f"), 64 * 1024);
    for i in 0..5 {
        fs::hard_link(root.join("p/f"), root.join(format!("p/link{i}"))).expect("link");
    }
    for threads in [1, 4] {
        let report = scan_with(root, threads);
        assert_eq!(report.total.files, 1, "threads = {threads}");
        let dirs = fs::metadata(root).expect("stat").size()
            + fs::metadata(root.join("p")).expect("stat").size();
        assert_eq!(report.total.apparent_bytes, 64 * 1024 + dirs);
        assert_eq!(report.total.bytes, du(root));
    }
}

#[test]
fn symlinks_are_never_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    symlink("/usr", root.join("usr")).expect("symlink");
    symlink("/", root.join("slash")).expect("symlink");
    symlink("nowhere", root.join("dangling")).expect("symlink");
    let report = scan_with(root, 2);
    assert_eq!((report.total.dirs, report.total.files), (1, 3));
    assert_eq!(report.total.bytes, du(root));
    assert_eq!(report.errors_total, 0, "{:?}", report.errors);

    // A symlink as the root is counted as the link itself, like `du -s LINK`.
    let report = scan_with(&root.join("usr"), 2);
    assert_eq!((report.total.dirs, report.total.files), (0, 1));
    assert_eq!(report.total.apparent_bytes, 4);
}

#[test]
fn a_file_root_is_one_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("f");
    write(&file, 9000);
    let report = scan_with(&file, 2);
    assert_eq!(
        (
            report.total.dirs,
            report.total.files,
            report.total.apparent_bytes
        ),
        (0, 1, 9000)
    );
    assert_eq!(report.total.bytes, du(&file));
}

#[test]
fn a_missing_root_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = scan(&dir.path().join("missing"), &ScanOptions::default()).expect_err("missing root");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}

/// Build `chains` directory chains under `root` whose deepest directories have paths longer than PATH_MAX
/// (4096): `read_dir` on them fails with ENAMETOOLONG whatever the caller's privileges. Each chain is two
/// halves of 9 levels of 250-character names, built separately and joined by a rename, so that no single
/// call needs a path that long. The file at the bottom of each chain is out of reach.
fn too_long_chains(root: &Path, chains: usize) {
    let half = std::iter::repeat_n("d".repeat(250), 9)
        .collect::<Vec<_>>()
        .join("/");
    for c in 0..chains {
        let top = root.join(format!("c{c}")).join(&half);
        fs::create_dir_all(&top).expect("mkdir");
        let bottom = root.join(format!("t{c}"));
        write(&bottom.join(&half).join("hidden"), 10);
        fs::rename(&bottom, top.join("t")).expect("rename");
    }
}

#[test]
fn unreadable_directories_are_reported_not_fatal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(&root.join("ok/f"), 1000);
    too_long_chains(root, 3);
    let report = scan_with(root, 2);
    assert_eq!(report.errors_total, 3, "{:?}", report.errors);
    assert_eq!(report.errors.len(), 3);
    assert!(
        report.errors.iter().all(|e| e.contains("too long")),
        "{:?}",
        report.errors
    );
    // Everything else is counted: the root, ok/, and in each chain c, 9 levels, t and the 8 levels down to the
    // unreadable one; ok/f but not the hidden files.
    assert_eq!(report.total.dirs, 2 + 3 * 19);
    assert_eq!(report.total.files, 1);

    // Permission bits only stop a non-root user.
    let locked = root.join("locked");
    write(&locked.join("secret"), 10);
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).expect("chmod");
    let unreadable = fs::read_dir(&locked).is_err();
    let report = scan_with(root, 2);
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).expect("chmod");
    if unreadable {
        assert_eq!(report.errors_total, 4, "{:?}", report.errors);
        assert!(
            report.errors.iter().any(|e| e.contains("locked")),
            "{:?}",
            report.errors
        );
    } else {
        assert_eq!(report.errors_total, 3, "{:?}", report.errors);
    }
}

#[test]
fn error_list_is_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    too_long_chains(dir.path(), MAX_ERRORS + 20);
    let report = scan_with(dir.path(), 4);
    assert_eq!(report.errors_total, (MAX_ERRORS + 20) as u64);
    assert_eq!(report.errors.len(), MAX_ERRORS);
}

#[test]
fn a_wider_tree_scans_the_same_with_any_thread_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    for p in 0..6 {
        for d in 0..12 {
            for f in 0..(d % 5) {
                write(
                    &root.join(format!("p{p}/d{d}/x/y{}/f{f}", d % 3)),
                    (p * 997 + d * 131 + f * 17) % 9000,
                );
            }
        }
    }
    let want = reference(root);
    let one = scan_with(root, 1);
    assert_eq!(one.total, want);
    assert_eq!(one.total.bytes, du(root));
    for threads in [2, 3, 16] {
        let report = scan_with(root, threads);
        assert_eq!(report, one, "threads = {threads}");
    }
}
