//! The batch as MessagePack (`schema/WIRE.md`, "MessagePack bodies"): the same fields as the JSON
//! body, each struct a map keyed by its field names, written and read by `rmp-serde` through the
//! same serde types, so the two encodings cannot describe different batches.
//!
//! What JSON decoding costs is mostly reading text: numbers out of digits, strings out of quotes
//! (docs/perf/ingest.md, "Decoding a live exporter's body"). MessagePack carries a ratio as 8 bytes
//! and a second as an integer, so a live body decodes in a fraction of the time
//! (docs/perf/ingest.md, "A binary body: MessagePack").
//!
//! Bounds: as for JSON, the values are counted before any is decoded ([`values_at_most`]), so a
//! body of many one-byte values cannot cost more memory than a batch may hold.

use rmp::Marker;
use serde::Deserialize;

use super::{Batch, VERSION, WireError};

/// `batch` as MessagePack, structs as maps (`rmp_serde`'s "named" form), into `out`.
pub(super) fn write(out: &mut impl std::io::Write, batch: &Batch) {
    rmp_serde::encode::write_named(out, batch).expect("a batch always serializes");
}

/// The values of a MessagePack document: the document, each array's elements and each map's
/// entries (every value but the keys; JSON's count, one more than its commas, is never larger),
/// counted by walking its markers without decoding any: stops once past `max`. Refuses a document
/// that ends inside a value, has bytes after it, or holds a byte that is no marker. A full batch
/// of the default limits stays inside [`Limits::max_values`](super::Limits::max_values): at most
/// 10 values a sample and 21 a series.
pub(super) fn values_at_most(bytes: &[u8], max: usize) -> Result<usize, String> {
    let ends = || "the MessagePack ends inside a value".to_owned();
    let mut at = 0usize;
    let len = |at: &mut usize, n: usize| -> Result<usize, String> {
        let b = bytes.get(*at..*at + n).ok_or_else(ends)?;
        *at += n;
        Ok(b.iter().fold(0usize, |v, &x| (v << 8) | usize::from(x)))
    };
    // Values still to be read, and values seen.
    let (mut pending, mut values) = (1usize, 1usize);
    while pending > 0 {
        let marker = *bytes.get(at).ok_or_else(ends)?;
        at += 1;
        pending -= 1;
        // (payload bytes to skip, values inside, entries counted)
        let (skip, inside, entries) = match Marker::from_u8(marker) {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
                (0, 0, 0)
            }
            Marker::U8 | Marker::I8 => (1, 0, 0),
            Marker::U16 | Marker::I16 => (2, 0, 0),
            Marker::U32 | Marker::I32 | Marker::F32 => (4, 0, 0),
            Marker::U64 | Marker::I64 | Marker::F64 => (8, 0, 0),
            Marker::FixStr(n) => (usize::from(n), 0, 0),
            Marker::Str8 | Marker::Bin8 => (len(&mut at, 1)?, 0, 0),
            Marker::Str16 | Marker::Bin16 => (len(&mut at, 2)?, 0, 0),
            Marker::Str32 | Marker::Bin32 => (len(&mut at, 4)?, 0, 0),
            Marker::FixArray(n) => (0, usize::from(n), usize::from(n)),
            Marker::Array16 => elements(len(&mut at, 2)?),
            Marker::Array32 => elements(len(&mut at, 4)?),
            Marker::FixMap(n) => (0, 2 * usize::from(n), usize::from(n)),
            Marker::Map16 => pairs(len(&mut at, 2)?),
            Marker::Map32 => pairs(len(&mut at, 4)?),
            Marker::FixExt1 => (2, 0, 0),
            Marker::FixExt2 => (3, 0, 0),
            Marker::FixExt4 => (5, 0, 0),
            Marker::FixExt8 => (9, 0, 0),
            Marker::FixExt16 => (17, 0, 0),
            Marker::Ext8 => (len(&mut at, 1)? + 1, 0, 0),
            Marker::Ext16 => (len(&mut at, 2)? + 1, 0, 0),
            Marker::Ext32 => (len(&mut at, 4)? + 1, 0, 0),
            Marker::Reserved => {
                return Err(format!("byte {} is 0xc1, which is not MessagePack", at - 1));
            }
        };
        at = at
            .checked_add(skip)
            .filter(|&end| end <= bytes.len())
            .ok_or_else(ends)?;
        values = values.saturating_add(entries);
        if values > max {
            return Ok(values);
        }
        pending = pending.saturating_add(inside);
    }
    if at != bytes.len() {
        return Err(format!(
            "{} bytes follow the batch's MessagePack",
            bytes.len() - at
        ));
    }
    Ok(values)
}

/// An array of `n`: nothing to skip, `n` values inside, `n` entries.
fn elements(n: usize) -> (usize, usize, usize) {
    (0, n, n)
}

/// A map of `n` pairs: nothing to skip, `2n` values inside, `n` entries.
fn pairs(n: usize) -> (usize, usize, usize) {
    (0, n.saturating_mul(2), n)
}

/// The batch's own fields: where a path naming a field starts.
const BATCH_FIELDS: [&str; 6] = ["v", "batch_id", "node", "series", "shares", "gpus"];

/// A body's maps and arrays nest fewer levels than this. A batch nests four deep (the batch,
/// `series`, a series, its columns). An unknown field is skipped, not refused, so without a bound
/// a body of a thousand nested one-element arrays, a thousand values, would be skipped by
/// recursion as deep as rmp-serde's own default of 1,024 levels, on a blocking thread's 2 MiB
/// stack. JSON's decoder stops at 128 levels.
pub(super) const MAX_DEPTH: usize = 16;

/// A decoder of `bytes` that refuses nesting deeper than [`MAX_DEPTH`].
fn decoder(bytes: &[u8]) -> rmp_serde::Deserializer<rmp_serde::decode::ReadRefReader<'_, [u8]>> {
    let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
    de.set_max_depth(MAX_DEPTH);
    de
}

/// Decodes a batch; a body that does not decode is read again to name the field, as JSON's is.
pub(super) fn parse(bytes: &[u8]) -> Result<Batch, WireError> {
    if let Ok(batch) = Batch::deserialize(&mut decoder(bytes)) {
        return Ok(batch);
    }
    let e = match serde_path_to_error::deserialize::<_, Batch>(&mut decoder(bytes)) {
        Ok(batch) => return Ok(batch),
        Err(e) => e,
    };
    #[derive(Deserialize)]
    struct VersionOnly {
        v: u32,
    }
    Err(match VersionOnly::deserialize(&mut decoder(bytes)) {
        Ok(VersionOnly { v }) if v != VERSION => WireError::UnknownVersion(v),
        // A path must start at a field of the batch: a map key that is no string (`?`), or one
        // that is a number, names no field, and is the body's fault.
        _ if matches!(
            e.path().iter().next(),
            Some(serde_path_to_error::Segment::Map { key }) if BATCH_FIELDS.contains(&key.as_str())
        ) =>
        {
            WireError::Invalid {
                field: e.path().to_string(),
                problem: e.inner().to_string(),
            }
        }
        _ => WireError::Malformed(format!("not a batch in MessagePack: {}", e.into_inner())),
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Format, Limits};
    use super::*;
    use crate::sample::{Attribution, Counters, Instance, Sample, ShareSample, SloClass};

    fn sample(t: i64, tenant: Option<&str>, sm: Option<f64>) -> Sample {
        Sample {
            timestamp: t,
            instance: Instance {
                node: "n1".into(),
                gpu_uuid: "GPU-a".into(),
                gpu_model: "NVIDIA H100 80GB HBM3".into(),
                mig_profile: Some("1g.10gb".into()),
                gpu_instance_id: Some(7),
                placement_start: Some(0),
                placement_size: Some(1),
            },
            attribution: Attribution {
                tenant: tenant.map(Into::into),
                workload: tenant.map(|t| format!("{t}/train")),
                slo_class: tenant.map(|_| SloClass::LatencyCritical),
                owner: None,
                owner_ref: None,
            },
            counters: Counters {
                sm_active: sm,
                fb_used_bytes: Some(1 << 33),
                fb_total_bytes: Some(10 << 30),
                nvlink_tx_bytes: Some(u64::from(u32::MAX) + 1),
                ..Counters::default()
            },
        }
    }

    fn batch() -> Batch {
        let share = ShareSample {
            timestamp: 2,
            instance: sample(2, None, None).instance,
            attribution: Attribution::default(),
            processes: 3,
            memory_used_bytes: Some(1 << 30),
            sm_active: Some(0.25),
        };
        Batch::from_samples(
            "n1",
            &[
                sample(1, Some("a"), Some(0.5)),
                sample(2, Some("a"), None),
                sample(3, None, Some(1.0)),
            ],
        )
        .with_shares(&[share])
    }

    fn msgpack(value: &serde_json::Value) -> Vec<u8> {
        rmp_serde::to_vec_named(value).unwrap()
    }

    fn decode(body: &[u8]) -> Result<Batch, WireError> {
        Batch::decode_as(body, false, Format::MessagePack, &Limits::default())
    }

    #[test]
    fn a_batch_reads_the_same_in_both_formats() {
        let batch = batch();
        let json = batch.encode_as(Format::Json);
        let packed = batch.encode_as(Format::MessagePack);
        let limits = Limits::default();
        assert_eq!(
            Batch::decode_as(&packed, true, Format::MessagePack, &limits).unwrap(),
            batch
        );
        assert_eq!(
            Batch::decode_as(&json, true, Format::Json, &limits).unwrap(),
            batch
        );
        // Each format is told by its first byte, and neither decodes as the other.
        assert_eq!(Format::of_body(&json, true), Format::Json);
        assert_eq!(Format::of_body(&packed, true), Format::MessagePack);
        assert!(Batch::decode_as(&packed, true, Format::Json, &limits).is_err());
        assert!(Batch::decode_as(&json, true, Format::MessagePack, &limits).is_err());
        // The batch id is the UUID's 16 bytes; a string (as a JSON-minded writer sends) reads too.
        let mut doc = Vec::new();
        write(&mut doc, &batch);
        let id = batch.batch_id.as_bytes();
        assert!(
            doc.windows(18)
                .any(|w| w[..2] == [0xc4, 16] && &w[2..] == id)
        );
        let as_text = msgpack(&serde_json::to_value(&batch).unwrap());
        assert_eq!(decode(&as_text).unwrap(), batch);
    }

    #[test]
    fn formats_follow_the_content_type() {
        assert_eq!(Format::of_content_type(None), Some(Format::Json));
        for (value, format) in [
            ("application/json", Some(Format::Json)),
            ("application/json; charset=utf-8", Some(Format::Json)),
            ("application/vnd.msgpack", Some(Format::MessagePack)),
            ("Application/MsgPack", Some(Format::MessagePack)),
            ("application/x-msgpack", Some(Format::MessagePack)),
            ("text/plain", None),
            ("application/cbor", None),
        ] {
            assert_eq!(Format::of_content_type(Some(value)), format, "{value}");
        }
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert_eq!("msgpack".parse::<Format>(), Ok(Format::MessagePack));
        assert!(
            "cbor"
                .parse::<Format>()
                .unwrap_err()
                .contains("json or msgpack")
        );
    }

    /// The walk counts what JSON's count does for the same document, and refuses what is not
    /// one whole MessagePack value.
    #[test]
    fn values_are_counted_by_their_markers() {
        let value = serde_json::json!({
            "a": [1, 2.5, -3, null, true, "text", [], {}],
            "b": {"c": [70000, 5000000000u64, -200, "x".repeat(300)]},
            "d": [[1, 2], [3, [4, 5]]],
        });
        let doc = msgpack(&value);
        let max = usize::MAX;
        // The document, each array's elements and each map's entries: every value but the keys.
        let walked = values_at_most(&doc, max).unwrap();
        assert_eq!(walked, 1 + 3 + 8 + 1 + 4 + 2 + 2 + 2 + 2);
        // Stops once past the bound.
        assert_eq!(values_at_most(&doc, 5).unwrap(), 12);
        for cut in [1, doc.len() / 2, doc.len() - 1] {
            let e = values_at_most(&doc[..cut], max).unwrap_err();
            assert!(e.contains("ends inside a value"), "{cut}: {e}");
        }
        let mut trailing = doc.clone();
        trailing.push(0);
        assert!(
            values_at_most(&trailing, max)
                .unwrap_err()
                .contains("1 bytes follow")
        );
        assert!(
            values_at_most(&[0x91, 0xc1], max)
                .unwrap_err()
                .contains("0xc1")
        );
        // A length past the end is refused, not allocated.
        assert!(values_at_most(&[0xdb, 0xff, 0xff, 0xff, 0xff], max).is_err());
        assert!(values_at_most(&[0xdd, 0xff, 0xff, 0xff, 0xff], max).is_err());
    }

    /// A body of one-byte values past what a batch may hold is refused before one is decoded,
    /// as a JSON one is.
    #[test]
    fn a_msgpack_bomb_is_refused_before_it_is_parsed() {
        let limits = Limits {
            max_samples: 1000,
            max_series: 10,
        };
        let mut value = serde_json::to_value(batch()).unwrap();
        value["series"][0]["t"] = serde_json::json!(vec![0; limits.max_values()]);
        let doc = msgpack(&value);
        assert!(doc.len() <= limits.max_decoded_bytes());
        let e = Batch::decode_as(&doc, false, Format::MessagePack, &limits).unwrap_err();
        assert!(matches!(e, WireError::TooLarge(_)), "{e}");
        assert!(e.to_string().contains("MessagePack values"), "{e}");
    }

    #[test]
    fn msgpack_errors_name_the_field() {
        let value = serde_json::to_value(batch()).unwrap();
        let with = |path: &[&str], v: serde_json::Value| {
            let mut changed = value.clone();
            let mut at = &mut changed;
            for p in path {
                at = match p.parse::<usize>() {
                    Ok(i) => &mut at[i],
                    Err(_) => &mut at[*p],
                };
            }
            *at = v;
            decode(&msgpack(&changed)).unwrap_err()
        };
        let e = with(&["series", "0", "sm_active", "1"], serde_json::json!(1.25));
        assert_eq!(e.field(), "series[0].sm_active[1]", "{e}");
        let e = with(&["series", "0", "t", "1"], serde_json::json!("soon"));
        assert_eq!(e.field(), "series[0].t[1]", "{e}");
        let e = with(&["shares", "0", "processes", "0"], serde_json::json!(-1));
        assert_eq!(e.field(), "shares[0].processes[0]", "{e}");
        assert_eq!(
            with(&["v"], serde_json::json!(2)),
            WireError::UnknownVersion(2)
        );
        let whole = msgpack(&value);
        assert_eq!(
            decode(&whole[..whole.len() / 2]).unwrap_err().field(),
            "body"
        );
        assert_eq!(decode(b"{\"v\": 1}").unwrap_err().field(), "body");
    }

    /// Regression: an unknown field nested a thousand arrays deep, a thousand values and well
    /// inside every size limit, was skipped by recursion 1,024 levels deep (rmp-serde's default),
    /// enough to overflow a blocking thread's stack and take the aggregator down.
    #[test]
    fn deep_nesting_is_refused_as_the_bodys_fault() {
        let mut deep = serde_json::json!(0);
        for _ in 0..1000 {
            deep = serde_json::json!([deep]);
        }
        let b = batch();
        let mut value = serde_json::to_value(&b).unwrap();
        value["extra"] = deep;
        let e = decode(&msgpack(&value)).unwrap_err();
        assert_eq!(e.field(), "body", "{e}");
        assert!(e.to_string().contains("depth"), "{e}");
        // Nesting up to the bound is still read: an unknown field of a few levels is skipped.
        let mut shallow = serde_json::json!(0);
        for _ in 0..(MAX_DEPTH - 2) {
            shallow = serde_json::json!([shallow]);
        }
        value["extra"] = shallow;
        assert_eq!(decode(&msgpack(&value)).unwrap(), b);
    }
}
