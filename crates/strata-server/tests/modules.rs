//! The agent's module graph: its top-level modules (the capabilities, the configuration, the plumbing) name
//! each other through `crate::<module>` paths, and those references form no cycle; the configuration names
//! none of the capabilities. A reference that closes a cycle fails here with the cycle spelled out.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every top-level module of `src/` and the top-level modules it names (`crate::x`), tests and comments
/// left out.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let top_of = |p: &Path| {
        let rel = p.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.trim_end_matches(".rs").to_string()
    };
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        g.entry(top_of(f)).or_default();
    }
    for f in &files {
        let top = top_of(f);
        let text = std::fs::read_to_string(f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let name: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if g.contains_key(&name) && name != top && name != "lib" {
                    g.get_mut(&top).unwrap().insert(name);
                }
            }
        }
    }
    g
}

#[test]
fn the_modules_of_the_agent_form_no_cycle() {
    let g = graph();
    // Depth-first search for a back edge, reporting the cycle it closes.
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        v: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(at) = path.iter().position(|p| p == v) {
            panic!("module cycle: {} -> {v}", path[at..].join(" -> "));
        }
        if done.contains(v) {
            return;
        }
        path.push(v.to_string());
        for w in &g[v] {
            visit(g, w, path, done);
        }
        path.pop();
        done.insert(v.to_string());
    }
    let mut done = BTreeSet::new();
    for v in g.keys() {
        visit(&g, v, &mut Vec::new(), &mut done);
    }
    assert!(g.len() > 10, "{g:?}");
}

#[test]
fn the_configuration_names_no_capability() {
    let g = graph();
    let capabilities = [
        "gateway", "api", "cluster", "claims", "replicas", "control", "routes",
    ];
    for c in capabilities {
        assert!(
            !g["config"].contains(c),
            "config names {c}: {:?}",
            g["config"]
        );
    }
}
