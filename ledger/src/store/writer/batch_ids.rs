//! Batch ids: which of a group's batches the ledger stored before, and recording the new ones.
//!
//! A batch id is looked up among the stored batches of the same earliest second
//! ([`Batch::first_second`]): a re-send carries the same seconds. Rows arrive roughly in that
//! order, so DuckDB's zone maps on `first_ts` skip all but the recent row groups; looking ids up
//! among every batch id of the raw window scanned the whole table once per group, which grows
//! to 43 M rows in 48 h for a 10,000-GPU fleet (migration 0007), so every group slowed as the
//! table grew (`cargo bench --bench aggregator -- writer-live`). A batch without seconds is
//! looked up among the rows without one. Missing an id is never wrong, only slower: the minute
//! masks still store each second once.

use std::collections::HashSet;

use duckdb::{Connection, params};
use gpuledger_schema::wire::Batch;

use super::IngestOutcome;

/// Which of `batches` are new: neither stored before nor repeated earlier in the group. Answers
/// an outcome per batch (a duplicate's says so; a new one's `stored` is filled in later) and the
/// indices of the new ones.
pub(super) fn new_batches(
    tx: &Connection,
    batches: &[(&Batch, i64)],
) -> duckdb::Result<(Vec<IngestOutcome>, Vec<usize>)> {
    let stored_before = stored_before(tx, batches)?;
    let mut seen = HashSet::new();
    let mut new = Vec::new();
    let outcomes = batches
        .iter()
        .enumerate()
        .map(|(i, (batch, _))| {
            let duplicate =
                stored_before.contains(&batch.batch_id.to_string()) || !seen.insert(batch.batch_id);
            if !duplicate {
                new.push(i);
            }
            let samples = batch.sample_count() as u64;
            IngestOutcome {
                samples,
                stored: 0,
                duplicate_samples: if duplicate { samples } else { 0 },
                duplicate_batch: duplicate,
            }
        })
        .collect();
    Ok((outcomes, new))
}

/// The ids (as text) of `batches` the ledger holds already. One query for the batches with
/// seconds and one, when any, for those without (a UUID's text never holds a comma).
fn stored_before(tx: &Connection, batches: &[(&Batch, i64)]) -> duckdb::Result<HashSet<String>> {
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    let (mut timed, mut untimed) = (Vec::new(), Vec::new());
    for (b, _) in batches {
        match b.first_second() {
            Some(t) => {
                lo = lo.min(t);
                hi = hi.max(t);
                timed.push(b.batch_id.to_string());
            }
            None => untimed.push(b.batch_id.to_string()),
        }
    }
    let mut stored = HashSet::new();
    let mut collect = |sql: &str, p: &[&dyn duckdb::ToSql]| -> duckdb::Result<()> {
        let mut stmt = tx.prepare_cached(sql)?;
        for row in stmt.query_map(p, |r| r.get::<_, String>(0))? {
            stored.insert(row?);
        }
        Ok(())
    };
    if !timed.is_empty() {
        collect(
            "SELECT DISTINCT batch_id::VARCHAR FROM ingested_batches
             WHERE first_ts BETWEEN ? AND ?
               AND batch_id IN (SELECT CAST(unnest(string_split(?, ',')) AS UUID))",
            params![lo, hi, timed.join(",")],
        )?;
    }
    if !untimed.is_empty() {
        collect(
            "SELECT DISTINCT batch_id::VARCHAR FROM ingested_batches
             WHERE first_ts IS NULL
               AND batch_id IN (SELECT CAST(unnest(string_split(?, ',')) AS UUID))",
            params![untimed.join(",")],
        )?;
    }
    Ok(stored)
}

/// Records the batches `new` (indexes into `batches`) with what became of them, through an
/// appender (an INSERT of a few hundred rows' placeholders is slow to parse and bind).
pub(super) fn record(
    tx: &Connection,
    batches: &[(&Batch, i64)],
    new: &[usize],
    outcomes: &[IngestOutcome],
) -> duckdb::Result<()> {
    let now = chrono::Utc::now().timestamp();
    let mut app = tx.appender("ingested_batches")?;
    for &i in new {
        let (b, o) = (batches[i].0, &outcomes[i]);
        app.append_row(params![
            b.batch_id.to_string(),
            b.node,
            now,
            o.samples as i64,
            o.stored as i64,
            b.first_second()
        ])?;
    }
    app.flush()
}

#[cfg(test)]
mod tests {
    use gpuledger_schema::{Counters, Sample};

    use super::super::tests::whole_h100;

    use super::*;

    fn batch(from: i64, seconds: i64) -> Batch {
        let samples: Vec<Sample> = (from..from + seconds)
            .map(|t| Sample {
                timestamp: t,
                instance: whole_h100("n1", "GPU-1".into()),
                attribution: Default::default(),
                counters: Counters::default(),
            })
            .collect();
        Batch::from_samples("n1", &samples)
    }

    #[test]
    fn a_recorded_id_is_found_by_its_first_second_and_an_id_without_seconds_too() {
        let (conn, _) = crate::store::open(std::path::Path::new(":memory:")).unwrap();
        let (a, b, empty, later) = (
            batch(1_000, 5),
            batch(1_005, 5),
            batch(0, 0),
            batch(9_000, 5),
        );
        let outcome = |b: &Batch| IngestOutcome {
            samples: b.sample_count() as u64,
            stored: b.sample_count() as u64,
            duplicate_samples: 0,
            duplicate_batch: false,
        };
        let all = [(&a, 0), (&b, 0), (&empty, 0)];
        let outcomes: Vec<_> = all.iter().map(|(b, _)| outcome(b)).collect();
        record(&conn, &all, &[0, 1, 2], &outcomes).unwrap();
        let firsts: Vec<Option<i64>> = conn
            .prepare("SELECT first_ts FROM ingested_batches ORDER BY first_ts NULLS FIRST")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(firsts, vec![None, Some(1_000), Some(1_005)]);
        let found = stored_before(&conn, &[(&later, 0), (&b, 0), (&empty, 0), (&a, 0)]).unwrap();
        let expected: HashSet<String> = [&a, &b, &empty]
            .iter()
            .map(|b| b.batch_id.to_string())
            .collect();
        assert_eq!(found, expected);
        assert!(stored_before(&conn, &[(&later, 0)]).unwrap().is_empty());
    }
}
