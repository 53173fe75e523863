//! Slurm host lists (`SLURM_JOB_NODELIST`, `scontrol show hostnames`): `node[01-04,07],gpu-a[1-2]-ib,login`
//! expanded to one name per node, in the order Slurm gives them.
//!
//! A list is names separated by top-level commas; a name is text with bracketed groups of numbers or ranges
//! (`[1-3,7]`), each expanded in place, several groups as their product (`r[1-2]n[1-2]` is `r1n1 r1n2 r2n1
//! r2n2`). A range keeps the width of its first bound (`[08-10]` is `08 09 10`). At most [`MAX_HOSTS`] names.

use strata_types::{Error, Result};

/// The most names one list expands to (a bound on what a malformed or hostile list can cost).
pub const MAX_HOSTS: usize = 1 << 20;

/// Every host name `list` names, in order.
pub fn expand(list: &str) -> Result<Vec<String>> {
    let bad = |why: &str| Error::invalid_input(format!("host list {list:?}: {why}"));
    let mut out = Vec::new();
    for item in split_top(list).map_err(&bad)? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    if rest.contains(']') {
                        return Err(bad("a ']' without its '['"));
                    }
                    for n in &mut names {
                        n.push_str(rest);
                    }
                    rest = "";
                }
                Some(open) => {
                    let (text, after) = rest.split_at(open);
                    if text.contains(']') {
                        return Err(bad("a ']' without its '['"));
                    }
                    let close = after
                        .find(']')
                        .ok_or_else(|| bad("a '[' without its ']'"))?;
                    let group = &after[1..close];
                    let values = numbers(group).map_err(|w| bad(&w))?;
                    if names.len().saturating_mul(values.len()) > MAX_HOSTS {
                        return Err(bad(&format!("more than {MAX_HOSTS} names")));
                    }
                    names = names
                        .iter()
                        .flat_map(|n| values.iter().map(move |v| format!("{n}{text}{v}")))
                        .collect();
                    rest = &after[close + 1..];
                }
            }
        }
        if out.len() + names.len() > MAX_HOSTS {
            return Err(bad(&format!("more than {MAX_HOSTS} names")));
        }
        out.extend(names);
    }
    Ok(out)
}

/// `list` cut at the commas outside brackets.
fn split_top(list: &str) -> std::result::Result<Vec<&str>, &'static str> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, Vec::new());
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("brackets do not nest");
        }
    }
    if depth != 0 {
        return Err("a '[' without its ']'");
    }
    out.push(&list[start..]);
    Ok(out)
}

/// The values of one bracket group (`01-04,07`), each as wide as its range's first bound.
fn numbers(group: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in group.split(',') {
        let part = part.trim();
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
        if !digits(a) || !digits(b) {
            return Err(format!(
                "[{group}]: {part:?} is not a number or a range of numbers"
            ));
        }
        let (lo, hi): (u64, u64) = (
            a.parse()
                .map_err(|_| format!("[{group}]: {a} is too large"))?,
            b.parse()
                .map_err(|_| format!("[{group}]: {b} is too large"))?,
        );
        if lo > hi {
            return Err(format!("[{group}]: the range {part} runs backwards"));
        }
        if out.len() as u64 + (hi - lo + 1) > MAX_HOSTS as u64 {
            return Err(format!("[{group}]: more than {MAX_HOSTS} values"));
        }
        let width = a.len();
        out.extend((lo..=hi).map(|v| format!("{v:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_expand_as_scontrol_show_hostnames_does() {
        assert_eq!(
            expand("node[01-03,07],gpu-a[1-2]-ib,login").unwrap(),
            [
                "node01",
                "node02",
                "node03",
                "node07",
                "gpu-a1-ib",
                "gpu-a2-ib",
                "login"
            ]
        );
        assert_eq!(expand("n[08-10]").unwrap(), ["n08", "n09", "n10"]);
        assert_eq!(expand("n[8-10]").unwrap(), ["n8", "n9", "n10"]);
        assert_eq!(
            expand("r[1-2]n[1-2]").unwrap(),
            ["r1n1", "r1n2", "r2n1", "r2n2"]
        );
        assert_eq!(expand("single").unwrap(), ["single"]);
        assert_eq!(expand("").unwrap(), Vec::<String>::new());
        assert_eq!(expand("a,,b").unwrap(), ["a", "b"]);
    }

    #[test]
    fn malformed_lists_are_refused_with_the_reason() {
        for bad in [
            "n[1-",
            "n1-2]",
            "n[a-b]",
            "n[3-1]",
            "n[[1]]",
            "n[1-99999999999999999999]",
        ] {
            let e = expand(bad).unwrap_err();
            assert_eq!(
                e.kind(),
                strata_types::ErrorKind::InvalidInput,
                "{bad}: {e}"
            );
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert!(expand("n[0-2000000]").is_err(), "the bound holds");
    }

    proptest::proptest! {
        #[test]
        fn a_list_of_plain_names_is_itself(names in proptest::collection::vec("[a-z][a-z0-9-]{0,12}", 0..20)) {
            proptest::prop_assert_eq!(expand(&names.join(",")).unwrap(), names);
        }

        #[test]
        fn a_range_has_as_many_names_as_numbers(lo in 0u32..500, n in 1u32..200, width in 1usize..5) {
            let list = format!("h[{lo:0width$}-{}]", lo + n - 1);
            let got = expand(&list).unwrap();
            proptest::prop_assert_eq!(got.len(), n as usize);
            proptest::prop_assert_eq!(&got[0], &format!("h{lo:0width$}"));
        }
    }
}
