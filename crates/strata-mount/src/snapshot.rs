//! The version a mount serves: the objects listed once when it was made, and the directory tree they form.
//!
//! The listing is written to the mount's state directory ([`Snapshot::save`]) so every server of the mount,
//! the first and each one started after a crash, builds the same [`Tree`] from it: inode numbers are the
//! positions of the nodes in a deterministic order, and the kernel keeps using the numbers it learned from the
//! server before. Nothing in a tree changes after it is built.
//!
//! Object keys are not all file names. A key that cannot be a path (an empty component as in `a//b`, `.` or
//! `..`, a component longer than 255 bytes, a NUL) is left out, as is an object whose name is also a
//! directory (`a` beside `a/b`: the directory wins); [`Tree::skipped`] counts them and the server logs the
//! first few. An object whose key ends with `/` (a "directory marker") makes a directory, not a file.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use strata_types::{Error, ErrorKind, Result};

/// One object of the version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Object {
    /// The key after the mounted location (`location` + `name` is the object's location).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// The ETag every read of it is pinned to (`If-Match`), when the backend gives one.
    pub etag: Option<String>,
    /// Last modification, seconds since the Unix epoch.
    pub mtime: i64,
}

/// The listing a mount serves, as saved in its state directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The mounted location, ending with `/` ([`normalize_location`]).
    pub location: String,
    /// When the listing was taken (seconds since the Unix epoch): the directories' times.
    pub taken_unix: i64,
    /// The objects in key order.
    pub objects: Vec<Object>,
}

/// A location as a mount lists it: a prefix ending with `/` (`NAME` alone becomes `NAME/`).
pub fn normalize_location(location: &str) -> Result<String> {
    let l = location.trim();
    if l.is_empty() {
        return Err(Error::invalid_input("the location to mount is empty"));
    }
    Ok(if l.ends_with('/') {
        l.to_string()
    } else {
        format!("{l}/")
    })
}

impl Snapshot {
    /// Write to `path` (through a temporary file, so a reader never sees half of it).
    pub fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("tmp");
        let bytes = serde_json::to_vec(self)
            .map_err(|e| Error::internal(format!("encoding the snapshot: {e}")))?;
        std::fs::write(&tmp, bytes).map_err(|e| Error::from_io(e, tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::from_io(e, path.display()))
    }

    /// Read what [`Snapshot::save`] wrote.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::from_io(e, path.display()))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("the mount's snapshot {}: {e}", path.display()),
            )
        })
    }
}

/// What a node of the tree is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A directory: its children's node indexes, sorted by name.
    Dir(Vec<u32>),
    /// A file: the index of its object in [`Snapshot::objects`].
    File(usize),
}

/// A file or directory. Its inode number is its index in [`Tree::nodes`] + 1 (the root is inode 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its name in its parent (empty for the root).
    pub name: OsString,
    /// The parent's node index (the root is its own parent).
    pub parent: u32,
    /// File or directory.
    pub kind: Kind,
}

/// The directory tree of a [`Snapshot`].
#[derive(Debug)]
pub struct Tree {
    /// The listing.
    pub snapshot: Snapshot,
    /// Every node; index 0 is the root.
    pub nodes: Vec<Node>,
    /// Keys left out, with why (at most the first 20 are kept; [`Tree::skipped`] counts them all).
    pub skipped_examples: Vec<(String, &'static str)>,
    /// How many objects are not in the tree.
    pub skipped: usize,
    /// Bytes of every file in the tree.
    pub total_bytes: u64,
}

/// A directory while the tree is built: children by name.
#[derive(Default)]
struct Building {
    dirs: BTreeMap<OsString, Building>,
    files: BTreeMap<OsString, usize>,
}

fn component_problem(c: &str) -> Option<&'static str> {
    if c.is_empty() {
        Some("an empty path component")
    } else if c == "." || c == ".." {
        Some("a `.` or `..` component")
    } else if c.len() > 255 {
        Some("a component longer than 255 bytes")
    } else if c.contains('\0') {
        Some("a NUL byte")
    } else {
        None
    }
}

impl Tree {
    /// The tree of `snapshot`.
    pub fn build(snapshot: Snapshot) -> Self {
        let mut root = Building::default();
        let mut skipped = 0;
        let mut examples = Vec::new();
        let mut skip =
            |name: &str, why: &'static str, examples: &mut Vec<(String, &'static str)>| {
                skipped += 1;
                if examples.len() < 20 {
                    examples.push((name.to_string(), why));
                }
            };
        for (i, o) in snapshot.objects.iter().enumerate() {
            let (path, marker) = match o.name.strip_suffix('/') {
                Some(p) => (p, true),
                None => (o.name.as_str(), false),
            };
            if path.is_empty() {
                // The location's own marker object: the root exists anyway.
                continue;
            }
            let parts: Vec<&str> = path.split('/').collect();
            if let Some(why) = parts.iter().find_map(|c| component_problem(c)) {
                skip(&o.name, why, &mut examples);
                continue;
            }
            let (last, dirs) = parts.split_last().expect("split yields one part at least");
            let mut d = &mut root;
            for c in dirs {
                d = d.dirs.entry(OsString::from(*c)).or_default();
            }
            if marker {
                d.dirs.entry(OsString::from(*last)).or_default();
            } else {
                d.files.insert(OsString::from(*last), i);
            }
        }
        // A name that is both a directory and a file: the directory wins.
        fn prune(d: &mut Building, objects: &[Object], skip: &mut dyn FnMut(&str, &'static str)) {
            let clash: Vec<OsString> = d
                .files
                .keys()
                .filter(|k| d.dirs.contains_key(*k))
                .cloned()
                .collect();
            for k in clash {
                if let Some(i) = d.files.remove(&k) {
                    skip(&objects[i].name, "a directory of the same name");
                }
            }
            for sub in d.dirs.values_mut() {
                prune(sub, objects, skip);
            }
        }
        prune(&mut root, &snapshot.objects, &mut |n, w| {
            skip(n, w, &mut examples)
        });
        let mut nodes = vec![Node {
            name: OsString::new(),
            parent: 0,
            kind: Kind::Dir(Vec::new()),
        }];
        let mut total_bytes = 0;
        // Breadth first: a directory's children get consecutive numbers.
        let mut queue = std::collections::VecDeque::from([(0u32, root)]);
        while let Some((idx, dir)) = queue.pop_front() {
            let mut names: Vec<(OsString, Option<Building>, Option<usize>)> = Vec::new();
            for (n, b) in dir.dirs {
                names.push((n, Some(b), None));
            }
            for (n, f) in dir.files {
                names.push((n, None, Some(f)));
            }
            names.sort_by(|a, b| a.0.cmp(&b.0));
            let mut children = Vec::with_capacity(names.len());
            for (name, sub, file) in names {
                let child = nodes.len() as u32;
                children.push(child);
                match (sub, file) {
                    (Some(b), _) => {
                        nodes.push(Node {
                            name,
                            parent: idx,
                            kind: Kind::Dir(Vec::new()),
                        });
                        queue.push_back((child, b));
                    }
                    (None, Some(f)) => {
                        total_bytes += snapshot.objects[f].size;
                        nodes.push(Node {
                            name,
                            parent: idx,
                            kind: Kind::File(f),
                        });
                    }
                    (None, None) => unreachable!("a child is a directory or a file"),
                }
            }
            nodes[idx as usize].kind = Kind::Dir(children);
        }
        Tree {
            snapshot,
            nodes,
            skipped_examples: examples,
            skipped,
            total_bytes,
        }
    }

    /// The node of inode `ino`.
    pub fn node(&self, ino: u64) -> Option<&Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get(i)
    }

    /// The inode of `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Option<u64> {
        let Kind::Dir(children) = &self.node(parent)?.kind else {
            return None;
        };
        children
            .binary_search_by(|c| self.nodes[*c as usize].name.as_bytes().cmp(name.as_bytes()))
            .ok()
            .map(|i| u64::from(children[i]) + 1)
    }

    /// The file after `ino` in its directory's name order (inode and object), if there is one: what a
    /// reader walking the directory (`cp -r`, a loader over sorted shards) opens next.
    pub fn next_file(&self, ino: u64) -> Option<(u64, &Object)> {
        // A directory's children have consecutive inodes (numbered breadth first, in name order).
        let parent = self.node(ino)?.parent;
        let next = ino.checked_add(1)?;
        let node = self.node(next)?;
        if node.parent != parent || ino == 1 {
            return None;
        }
        Some((next, self.object(next)?))
    }

    /// The object a file inode reads.
    pub fn object(&self, ino: u64) -> Option<&Object> {
        match self.node(ino)?.kind {
            Kind::File(i) => self.snapshot.objects.get(i),
            Kind::Dir(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(names: &[(&str, u64)]) -> Snapshot {
        Snapshot {
            location: "data/".into(),
            taken_unix: 1,
            objects: names
                .iter()
                .map(|(n, s)| Object {
                    name: n.to_string(),
                    size: *s,
                    etag: Some(format!("e-{n}")),
                    mtime: 2,
                })
                .collect(),
        }
    }

    #[test]
    fn keys_become_a_tree_with_stable_inodes_and_unnameable_keys_are_left_out() {
        let s = snap(&[
            ("a", 1),
            ("a/b", 2),
            ("dir/", 0),
            ("x y+%#é/f", 3),
            ("bad//k", 4),
            ("../up", 5),
            ("z", 6),
        ]);
        let t = Tree::build(s.clone());
        let names = |ino: u64| -> Vec<String> {
            match &t.node(ino).expect("node").kind {
                Kind::Dir(c) => c
                    .iter()
                    .map(|i| t.nodes[*i as usize].name.to_string_lossy().into_owned())
                    .collect(),
                Kind::File(_) => vec![],
            }
        };
        assert_eq!(names(1), ["a", "dir", "x y+%#é", "z"]);
        let a = t.lookup(1, OsStr::new("a")).expect("a");
        assert!(matches!(t.node(a).expect("a").kind, Kind::Dir(_)));
        let b = t.lookup(a, OsStr::new("b")).expect("b");
        assert_eq!(t.object(b).expect("object").size, 2);
        assert_eq!(t.skipped, 3, "{:?}", t.skipped_examples);
        assert_eq!(t.total_bytes, 2 + 3 + 6);
        assert!(t.lookup(1, OsStr::new("bad")).is_none());
        // The same listing gives the same numbers (a restarted server keeps the kernel's inodes right).
        let again = Tree::build(s);
        assert_eq!(again.nodes, t.nodes);
        assert!(t.node(0).is_none() && t.node(99).is_none());
    }
}
