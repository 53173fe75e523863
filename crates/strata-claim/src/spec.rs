//! The claim document and its validation.

use serde::{Deserialize, Serialize};
use strata_types::{ByteSize, Error, Result};

/// The claim format version this build reads and writes.
pub const SPEC_VERSION: u32 = 1;

/// Default heartbeat TTL: a claim nobody has heard from for this long is released.
pub const DEFAULT_TTL_SECS: u64 = 86_400;
/// Default staging deadline: a claim not ready this long after it was submitted fails.
pub const DEFAULT_STAGE_DEADLINE_SECS: u64 = 3_600;
const MAX_DATASETS: usize = 64;
const MAX_LOCATION: usize = 4096;

/// What a job declares about its data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimSpec {
    /// Format version: 1.
    pub version: u32,
    /// The job's id (a Slurm job id, `namespace/name` on Kubernetes): 1 to 128 of `A-Z a-z 0-9 . _ : / -`.
    /// May be left out of a file when whoever submits it sets it (`strata claim submit --job`, the Slurm
    /// integration).
    #[serde(default)]
    pub job: String,
    /// The team the claim is charged to.
    pub team: String,
    /// The datasets the job reads.
    #[serde(default)]
    pub datasets: Vec<DatasetClaim>,
    /// Where the job writes checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointClaim>,
    /// Scratch space for the job's life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch: Option<ScratchClaim>,
    /// Seconds without a heartbeat after which the claim is released (10 s to 30 days; default one day).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// Seconds after submission by which staging must be done, else the claim fails (10 s to 7 days; default
    /// one hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_deadline_secs: Option<u64>,
}

/// One dataset of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetClaim {
    /// The dataset's name in the claim (`STRATA_DATASET_<NAME>` in the job's environment): 1 to 63 of
    /// `a-z 0-9 _ -`, starting with a letter.
    pub name: String,
    /// Where it is: a location (`backend/prefix/`, `s3://bucket/prefix/`, one object's key).
    pub location: String,
    /// How the job gets it (default `stage`).
    #[serde(default)]
    pub mode: Mode,
    /// Where the job finds it as files (an absolute path), if anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
    /// Copies of each block the cache cluster keeps (1 to 8; default 1): staged on the block's first
    /// `replicas` owners, so a node that leaves takes no block with it. At most one per member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
}

/// Most copies of a block a claim may ask for.
pub const MAX_REPLICAS: u32 = 8;

impl DatasetClaim {
    /// Copies of each block to keep (`replicas`, default 1).
    pub fn replicas(&self) -> u32 {
        self.replicas.unwrap_or(1)
    }
}

/// How a job gets a dataset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every block in the cache before the job starts.
    #[default]
    Stage,
    /// Staged, and pinned in the cache (never evicted) until the claim is released; charged to the team's
    /// `cache` quota.
    Pin,
    /// Read through the cache as the job goes; nothing staged. The versions are still pinned.
    Stream,
}

impl Mode {
    /// The name used in the spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Stage => "stage",
            Mode::Pin => "pin",
            Mode::Stream => "stream",
        }
    }
}

/// A claim's checkpoint declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointClaim {
    /// Where checkpoints go (a prefix location).
    pub location: String,
    /// Steps kept (1 to 1000); older ones may be deleted by retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u32>,
}

/// A claim's scratch declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScratchClaim {
    /// Bytes (`10GiB` or a number), admitted against the team's `scratch` quota.
    pub size: ByteSize,
    /// Seconds the scratch may outlive a claim that was never released (1 s to 90 days).
    pub ttl_secs: u64,
}

/// One problem with a claim, and the field it is in (`datasets[1].mode`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    /// The field's path.
    pub field: String,
    /// What is wrong, and what would be right.
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn invalid(errors: &[FieldError]) -> Error {
    let list: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    Error::invalid_input(format!("invalid claim: {}", list.join("; ")))
}

/// The path of a serde error as the spec's fields are written (`datasets[0].mode`).
fn path_error<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> FieldError {
    let field = e.path().to_string();
    let message = e.into_inner().to_string();
    FieldError {
        field: if field == "." {
            "(claim)".into()
        } else {
            field
        },
        message,
    }
}

impl ClaimSpec {
    /// Parse a claim from YAML (JSON is YAML too) and validate it. Every error names its field.
    pub fn parse(text: &str) -> Result<Self> {
        let spec = Self::parse_unchecked(text)?;
        spec.check()?;
        Ok(spec)
    }

    /// Parse a claim from YAML without the rules of [`Self::validate`] (for a caller that fills in fields,
    /// such as the job, before checking it). Type errors still name their field.
    pub fn parse_unchecked(text: &str) -> Result<Self> {
        let de = serde_norway::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let mut fe = path_error(e);
            // The YAML error says where in the text; the path says which field.
            fe.message = fe.message.replace(" at line", ", at line");
            invalid(&[fe])
        })
    }

    /// Parse a claim from JSON (the API's body) and validate it.
    pub fn from_json(body: &[u8]) -> Result<Self> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let spec: ClaimSpec =
            serde_path_to_error::deserialize(&mut de).map_err(|e| invalid(&[path_error(e)]))?;
        spec.check()?;
        Ok(spec)
    }

    /// [`Self::validate`] as one `invalid_input` error listing every problem.
    pub fn check(&self) -> Result<()> {
        self.validate().map_err(|e| invalid(&e))
    }

    /// Every problem of the claim, each naming its field; `Ok` when there are none.
    pub fn validate(&self) -> std::result::Result<(), Vec<FieldError>> {
        let mut errs = Vec::new();
        let mut err = |field: String, message: String| errs.push(FieldError { field, message });
        if self.version != SPEC_VERSION {
            err(
                "version".into(),
                format!(
                    "{}: this agent reads claim version {SPEC_VERSION}",
                    self.version
                ),
            );
        }
        if !valid_job(&self.job) {
            err(
                "job".into(),
                format!(
                    "{:?}: use 1 to 128 of A-Z, a-z, 0-9, '.', '_', ':', '/', '-'",
                    self.job
                ),
            );
        }
        if !valid_team(&self.team) {
            err(
                "team".into(),
                format!(
                    "{:?}: use 1 to 63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit",
                    self.team
                ),
            );
        }
        if self.datasets.is_empty() && self.checkpoint.is_none() && self.scratch.is_none() {
            err(
                "datasets".into(),
                "a claim declares at least one dataset, a checkpoint or scratch".into(),
            );
        }
        if self.datasets.len() > MAX_DATASETS {
            err(
                "datasets".into(),
                format!("{} datasets: at most {MAX_DATASETS}", self.datasets.len()),
            );
        }
        for (i, d) in self.datasets.iter().enumerate() {
            let f = |name: &str| format!("datasets[{i}].{name}");
            if !valid_dataset_name(&d.name) {
                err(
                    f("name"),
                    format!(
                        "{:?}: use 1 to 63 of a-z, 0-9, '_', '-', starting with a letter",
                        d.name
                    ),
                );
            } else if self.datasets[..i].iter().any(|o| o.name == d.name) {
                err(f("name"), format!("{:?} is named twice", d.name));
            }
            if let Some(m) = location_problem(&d.location) {
                err(f("location"), m);
            }
            if let Some(r) = d.replicas {
                if !(1..=MAX_REPLICAS).contains(&r) {
                    err(f("replicas"), format!("{r}: use 1 to {MAX_REPLICAS}"));
                } else if r > 1 && d.mode == Mode::Stream {
                    err(
                        f("replicas"),
                        format!("{r}: copies are kept of staged data; mode stream stages nothing"),
                    );
                }
            }
            if let Some(mount) = &d.mount {
                if let Some(m) = mount_problem(mount) {
                    err(f("mount"), m);
                } else if self.datasets[..i]
                    .iter()
                    .any(|o| o.mount.as_deref().is_some_and(|om| nested(om, mount)))
                {
                    err(
                        f("mount"),
                        format!("{mount:?} overlaps another dataset's mount"),
                    );
                }
            }
        }
        if let Some(c) = &self.checkpoint {
            if let Some(m) = location_problem(&c.location) {
                err("checkpoint.location".into(), m);
            }
            if let Some(k) = c.keep_last
                && !(1..=1000).contains(&k)
            {
                err("checkpoint.keep_last".into(), format!("{k}: use 1 to 1000"));
            }
        }
        if let Some(s) = &self.scratch {
            if s.size.bytes() == 0 || s.size.bytes() > 1 << 50 {
                err(
                    "scratch.size".into(),
                    format!("{}: use more than 0 and at most 1 PiB", s.size),
                );
            }
            if !(1..=90 * 86_400).contains(&s.ttl_secs) {
                err(
                    "scratch.ttl_secs".into(),
                    format!("{}: use 1 s to 90 days", s.ttl_secs),
                );
            }
        }
        if let Some(t) = self.ttl_secs
            && !(10..=30 * 86_400).contains(&t)
        {
            err("ttl_secs".into(), format!("{t}: use 10 s to 30 days"));
        }
        if let Some(t) = self.stage_deadline_secs
            && !(10..=7 * 86_400).contains(&t)
        {
            err(
                "stage_deadline_secs".into(),
                format!("{t}: use 10 s to 7 days"),
            );
        }
        if errs.is_empty() { Ok(()) } else { Err(errs) }
    }

    /// The heartbeat TTL in seconds.
    pub fn ttl(&self) -> u64 {
        self.ttl_secs.unwrap_or(DEFAULT_TTL_SECS)
    }

    /// The staging deadline in seconds after submission.
    pub fn stage_deadline(&self) -> u64 {
        self.stage_deadline_secs
            .unwrap_or(DEFAULT_STAGE_DEADLINE_SECS)
    }
}

fn valid_job(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
}

fn valid_team(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

fn valid_dataset_name(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.as_bytes()[0].is_ascii_lowercase()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-".contains(&b))
}

fn location_problem(s: &str) -> Option<String> {
    if s.is_empty() {
        Some("empty: name a location (backend/prefix/, s3://bucket/prefix/)".into())
    } else if s.len() > MAX_LOCATION {
        Some(format!("{} bytes: at most {MAX_LOCATION}", s.len()))
    } else if s.chars().any(char::is_control) {
        Some(format!("{s:?} has a control character"))
    } else {
        None
    }
}

fn mount_problem(s: &str) -> Option<String> {
    if !s.starts_with('/') {
        Some(format!("{s:?}: use an absolute path"))
    } else if s == "/" {
        Some("\"/\": not the root".into())
    } else if s.len() > MAX_LOCATION || s.chars().any(char::is_control) {
        Some(format!("{s:?}: too long, or a control character"))
    } else if s.split('/').any(|c| c == ".." || c == ".") {
        Some(format!("{s:?}: no '.' or '..' components"))
    } else {
        None
    }
}

/// Whether one mount path is the other or inside it.
fn nested(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim_end_matches('/'), b.trim_end_matches('/'));
    let inside = |x: &str, y: &str| x == y || x.starts_with(&format!("{y}/"));
    inside(a, b) || inside(b, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "
version: 1
job: slurm-4242
team: vision
datasets:
  - name: train
    location: origin/train/
    mount: /mnt/strata/train
    replicas: 2
  - name: eval
    location: s3://bucket/eval/
    mode: stream
checkpoint:
  location: origin/ckpt/run-1/
  keep_last: 3
scratch:
  size: 10GiB
  ttl_secs: 86400
";

    fn errors(text: &str) -> String {
        ClaimSpec::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn a_good_claim_parses_from_yaml_and_json_alike() {
        let s = ClaimSpec::parse(GOOD).unwrap();
        assert_eq!(s.datasets[0].mode, Mode::Stage);
        assert_eq!(s.datasets[1].mode, Mode::Stream);
        assert_eq!(s.scratch.as_ref().unwrap().size, ByteSize::gib(10));
        assert_eq!(s.ttl(), DEFAULT_TTL_SECS);
        let json = serde_json::to_vec(&s).unwrap();
        assert_eq!(ClaimSpec::from_json(&json).unwrap(), s);
        assert_eq!(
            ClaimSpec::parse(std::str::from_utf8(&json).unwrap()).unwrap(),
            s
        );
    }

    #[test]
    fn type_errors_name_the_field() {
        let e = errors(&GOOD.replace("mode: stream", "mode: streem"));
        assert!(
            e.contains("datasets[1].mode") && e.contains("streem"),
            "{e}"
        );
        let e = errors(&GOOD.replace("keep_last: 3", "keep_lats: 3"));
        assert!(e.contains("checkpoint") && e.contains("keep_lats"), "{e}");
        let e = errors(&GOOD.replace("size: 10GiB", "size: 10 furlongs"));
        assert!(e.contains("scratch.size"), "{e}");
        let e = ClaimSpec::from_json(
            br#"{"version":1,"job":"j","team":"t","datasets":[{"name":"a","location":7}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("datasets[0].location"), "{e}");
    }

    #[test]
    fn every_rule_names_its_field() {
        let cases = [
            ("version: 1", "version: 2", "version"),
            ("job: slurm-4242", "job: \"a b\"", "job"),
            ("team: vision", "team: Vision", "team"),
            ("name: eval", "name: train", "datasets[1].name"),
            ("name: eval", "name: 9eval", "datasets[1].name"),
            (
                "location: s3://bucket/eval/",
                "location: \"\"",
                "datasets[1].location",
            ),
            (
                "mount: /mnt/strata/train",
                "mount: mnt/train",
                "datasets[0].mount",
            ),
            (
                "mount: /mnt/strata/train",
                "mount: /mnt/../etc",
                "datasets[0].mount",
            ),
            ("replicas: 2", "replicas: 0", "datasets[0].replicas"),
            ("replicas: 2", "replicas: 9", "datasets[0].replicas"),
            (
                "mode: stream",
                "mode: stream\n    replicas: 2",
                "datasets[1].replicas",
            ),
            ("keep_last: 3", "keep_last: 0", "checkpoint.keep_last"),
            ("size: 10GiB", "size: 0", "scratch.size"),
            ("ttl_secs: 86400", "ttl_secs: 0", "scratch.ttl_secs"),
        ];
        for (from, to, field) in cases {
            let text = GOOD.replacen(from, to, 1);
            assert_ne!(text, GOOD, "{from}");
            let e = errors(&text);
            assert!(e.contains(&format!("{field}:")), "{to}: {e}");
        }
        let e = errors(&format!("{GOOD}ttl_secs: 5\nstage_deadline_secs: 1\n"));
        assert!(
            e.contains("ttl_secs: 5") && e.contains("stage_deadline_secs: 1"),
            "every problem at once: {e}"
        );
        let e = errors("version: 1\njob: j\nteam: t\n");
        assert!(e.contains("at least one dataset"), "{e}");
        let two = GOOD.replace(
            "mode: stream",
            "mode: stream\n    mount: /mnt/strata/train/sub",
        );
        assert!(errors(&two).contains("overlaps"));
    }
}
