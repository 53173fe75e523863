//! Rollups on disk: hive-partitioned, zstd-compressed Parquet that duckdb, pandas and Spark read as they are
//! (`read_parquet('DIR/**/*.parquet', hive_partitioning = true)`).
//!
//! Layout: `DIR/date=YYYY-MM-DD/team=TEAM/<minute>-<agent>.parquet`, one file per closed minute, team and
//! agent (no team: `team=__HIVE_DEFAULT_PARTITION__`, Hive's null). A file is written under a temporary name
//! and renamed into place, so a reader never sees half a file and a kill loses at most the minutes not yet
//! written. Columns: `minute` (unix seconds of its start), `agent`, `job`, `dataset`, `prefix`, `class`
//! (`data_read`, `data_write`, `meta_read`, `meta_write`), `count`, `errors`, `bytes`, `latency_sum_us`,
//! `p50_us`, `p99_us`, `ram_bytes`, `disk_bytes`, `peer_bytes`, `origin_bytes`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use strata_types::{Error, Result};

use crate::rollup::{Minute, RollupKey, RollupRow};

/// Hive's name for a null partition value.
pub const NULL_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

const SCHEMA: &str = "message rollup {
    required int64 minute;
    required binary agent (UTF8);
    required binary job (UTF8);
    required binary dataset (UTF8);
    required binary prefix (UTF8);
    required binary class (UTF8);
    required int64 count;
    required int64 errors;
    required int64 bytes;
    required int64 latency_sum_us;
    required int64 p50_us;
    required int64 p99_us;
    required int64 ram_bytes;
    required int64 disk_bytes;
    required int64 peer_bytes;
    required int64 origin_bytes;
}";

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::internal(format!("analytics files: {what}: {e}"))
}

/// `YYYY-MM-DD` of a unix time (UTC).
pub fn date_of(unix: u64) -> String {
    // Civil-from-days (Howard Hinnant's algorithm), for dates after 1970.
    let z = (unix / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// A partition value as a directory name: the team's name (team names are plain), else Hive's null.
fn partition(team: &str) -> String {
    let safe = !team.is_empty()
        && team
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !team.starts_with('.');
    if safe {
        team.to_string()
    } else {
        NULL_PARTITION.to_string()
    }
}

/// Write `minutes` under `dir` as this `agent`'s files; the paths written.
pub fn write_minutes(dir: &Path, agent: &str, minutes: &[Minute]) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for m in minutes {
        let mut by_team: BTreeMap<&str, Vec<(&RollupKey, &RollupRow)>> = BTreeMap::new();
        for (k, r) in &m.rows {
            by_team.entry(&k.team).or_default().push((k, r));
        }
        for (team, mut rows) in by_team {
            rows.sort_by(|a, b| a.0.cmp(b.0));
            let part = dir
                .join(format!("date={}", date_of(m.start)))
                .join(format!("team={}", partition(team)));
            std::fs::create_dir_all(&part)
                .map_err(|e| Error::from_io(e, format!("creating {}", part.display())))?;
            let name = format!("{}-{}.parquet", m.start, partition(agent));
            let path = part.join(&name);
            let tmp = part.join(format!(".{name}.tmp"));
            write_file(&tmp, m.start, agent, &rows)?;
            std::fs::rename(&tmp, &path)
                .map_err(|e| Error::from_io(e, format!("renaming {}", tmp.display())))?;
            written.push(path);
        }
    }
    Ok(written)
}

fn write_file(
    path: &Path,
    minute: u64,
    agent: &str,
    rows: &[(&RollupKey, &RollupRow)],
) -> Result<()> {
    let schema = Arc::new(parse_message_type(SCHEMA).map_err(|e| err("schema", e))?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build(),
    );
    let file = std::fs::File::create(path)
        .map_err(|e| Error::from_io(e, format!("creating {}", path.display())))?;
    let mut w = SerializedFileWriter::new(file, schema, props).map_err(|e| err("writer", e))?;
    let text = |f: &dyn Fn(&RollupKey) -> String| -> Vec<ByteArray> {
        rows.iter()
            .map(|(k, _)| ByteArray::from(f(k).as_str()))
            .collect()
    };
    let num = |f: &dyn Fn(&RollupRow) -> u64| -> Vec<i64> {
        rows.iter()
            .map(|(_, r)| f(r).min(i64::MAX as u64) as i64)
            .collect()
    };
    let us = |d: std::time::Duration| d.as_micros().min(i64::MAX as u128) as u64;
    enum Col {
        Text(Vec<ByteArray>),
        Num(Vec<i64>),
    }
    let cols = vec![
        Col::Num(vec![minute as i64; rows.len()]),
        Col::Text(vec![ByteArray::from(agent); rows.len()]),
        Col::Text(text(&|k| k.job.to_string())),
        Col::Text(text(&|k| k.dataset.to_string())),
        Col::Text(text(&|k| k.prefix.to_string())),
        Col::Text(text(&|k| k.class.as_str().to_string())),
        Col::Num(num(&|r| r.count)),
        Col::Num(num(&|r| r.errors)),
        Col::Num(num(&|r| r.bytes)),
        Col::Num(num(&|r| r.latency_sum_us)),
        Col::Num(num(&|r| us(r.latency.quantile(0.5)))),
        Col::Num(num(&|r| us(r.latency.quantile(0.99)))),
        Col::Num(num(&|r| r.tier_bytes[0])),
        Col::Num(num(&|r| r.tier_bytes[1])),
        Col::Num(num(&|r| r.tier_bytes[2])),
        Col::Num(num(&|r| r.tier_bytes[3])),
    ];
    let mut rg = w.next_row_group().map_err(|e| err("row group", e))?;
    let mut cols = cols.into_iter();
    while let Some(mut c) = rg.next_column().map_err(|e| err("column", e))? {
        let Some(col) = cols.next() else {
            return Err(err("columns", "more in the schema than written"));
        };
        match col {
            Col::Text(v) => c.typed::<ByteArrayType>().write_batch(&v, None, None),
            Col::Num(v) => c.typed::<Int64Type>().write_batch(&v, None, None),
        }
        .map_err(|e| err("writing a column", e))?;
        c.close().map_err(|e| err("closing a column", e))?;
    }
    rg.close().map_err(|e| err("closing the row group", e))?;
    let f = w.into_inner().map_err(|e| err("closing the file", e))?;
    f.sync_all()
        .map_err(|e| Error::from_io(e, format!("syncing {}", path.display())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_calendar_days() {
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(951_782_400), "2000-02-29");
        assert_eq!(date_of(1_796_661_076), "2026-12-07");
    }

    #[test]
    fn partitions_are_plain_names_or_hives_null() {
        assert_eq!(partition("vision"), "vision");
        assert_eq!(partition(""), NULL_PARTITION);
        assert_eq!(partition("../x"), NULL_PARTITION);
        assert_eq!(partition("a/b"), NULL_PARTITION);
    }
}
