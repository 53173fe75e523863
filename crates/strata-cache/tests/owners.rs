//! The cache's state has owners: each part of it is a type whose fields only its own module reads, and the
//! rest of the crate goes through its methods. These checks read the sources, so a change that reaches past
//! an owner fails here, not in a review.

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every source file of the crate but its tests, with its text up to its first `#[cfg(test)]` module.
fn sources() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![src()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("src readable") {
            let p = e.expect("entry").path();
            let rel = p
                .strip_prefix(src())
                .expect("under src")
                .display()
                .to_string();
            if p.is_dir() {
                if rel != "tests" {
                    dirs.push(p);
                }
            } else if rel.ends_with(".rs") {
                let text = std::fs::read_to_string(&p).expect("readable");
                let text = match text.find("#[cfg(test)]\nmod tests") {
                    Some(i) => text[..i].to_string(),
                    None => text,
                };
                out.push((rel, text));
            }
        }
    }
    out.sort();
    assert!(out.len() > 10, "found the sources: {out:?}");
    out
}

/// The field lines of `struct name` in `text` (a tuple struct's one line), if it is defined there.
fn fields<'a>(text: &'a str, name: &str) -> Option<Vec<&'a str>> {
    let at = text.lines().position(|l| {
        let l = l.trim_start();
        let l = l
            .strip_prefix("pub(crate) ")
            .or(l.strip_prefix("pub "))
            .unwrap_or(l);
        l.starts_with(&format!("struct {name} ")) || l.starts_with(&format!("struct {name}("))
    })?;
    let mut lines = text.lines().skip(at);
    let first = lines.next()?;
    if first.contains('(') {
        return Some(vec![&first[first.find('(')? + 1..]]);
    }
    Some(
        lines
            .take_while(|l| !l.starts_with('}'))
            .map(str::trim)
            .filter(|l| !l.starts_with("//") && !l.starts_with("#[") && !l.is_empty())
            .collect(),
    )
}

#[test]
fn no_module_imports_another_by_glob() {
    for (file, text) in sources() {
        for l in text.lines() {
            let l = l.trim();
            assert!(
                !(l.starts_with("use ") && l.ends_with("::*;")),
                "{file}: `{l}`: name what you use, so a reader sees which owner it reaches"
            );
        }
    }
}

#[test]
fn only_the_budget_reserves_memory() {
    for (file, text) in sources() {
        if file == "budget.rs" {
            continue;
        }
        for needle in ["acquire_many", "OwnedSemaphorePermit", "Semaphore::new"] {
            assert!(
                !text.contains(needle),
                "{file} names `{needle}`: memory for bytes in flight is reserved through `budget::Budget`"
            );
        }
    }
}

#[test]
fn the_owners_keep_their_fields_private() {
    let owners = [
        ("budget.rs", &["Budget", "Share", "Spill"][..]),
        ("tier/mod.rs", &["Tiers"]),
        ("tier/ram.rs", &["Ram", "RamState"]),
        ("tier/writes.rs", &["DiskStore", "DiskJob"]),
        ("tier/pins.rs", &["Pins"]),
        ("fill.rs", &["Flights"]),
        ("meta/mod.rs", &["MetaCache"]),
        ("stage.rs", &["Staged", "StagedBlock"]),
    ];
    let all = sources();
    for (file, names) in owners {
        let text = &all
            .iter()
            .find(|(f, _)| f == file)
            .unwrap_or_else(|| panic!("{file} exists"))
            .1;
        for name in names {
            let fields = fields(text, name).unwrap_or_else(|| panic!("{file} defines {name}"));
            assert!(!fields.is_empty(), "{file}: {name} has fields");
            for f in fields {
                assert!(
                    !f.starts_with("pub"),
                    "{file}: {name}'s field `{f}` is visible outside its owner"
                );
            }
        }
    }
    // The metadata map is the metadata cache's: visible to its module tree, not to the crate.
    let map = &all
        .iter()
        .find(|(f, _)| f == "meta/map.rs")
        .expect("meta/map.rs")
        .1;
    assert!(
        !map.contains("pub(crate)"),
        "meta/map.rs exposes something to the whole crate"
    );
}
