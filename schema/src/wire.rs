//! The ingest batch: how an exporter ships samples to the aggregator. Specified in
//! `schema/WIRE.md`.
//!
//! A batch is JSON or MessagePack ([`Format`]), gzip-compressed on the wire (`Content-Encoding:
//! gzip`), column-oriented per series: a series is one instance held by one attribution, with a
//! `t` array of seconds and one array per counter, all the same length. Columns that are entirely
//! unmeasured are left out. The `batch_id` (a UUIDv7) is what the receiver deduplicates on.

use std::collections::HashMap;
use std::io::{Read, Write};

use flate2::Compression;
// The body is in memory already: `bufread`'s decoder reads it in place, where `read`'s would
// copy it through a 32 KiB buffer allocated (and zeroed) per body.
use flate2::bufread::GzDecoder;
use flate2::write::GzEncoder;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::sample::{
    Attribution, Counters, GpuSample, Instance, InvalidField, MAX_GPU_JOULES_PER_SECOND, Sample,
    ShareSample, SloClass,
};

mod msgpack;

/// The wire version this build writes and the only one it reads.
pub const VERSION: u32 = 1;
/// The media type of a JSON batch body.
pub const CONTENT_TYPE: &str = "application/json";
/// The media type of a MessagePack batch body (IANA's `application/vnd.msgpack`; the older
/// `application/msgpack` and `application/x-msgpack` are read too).
pub const MSGPACK_CONTENT_TYPE: &str = "application/vnd.msgpack";
/// The ingest path on the aggregator.
pub const INGEST_PATH: &str = "/api/v1/ingest";

/// The HTTP header that carries a batch's id beside its body, so that a receiver can answer a
/// batch it stored before without decoding it again.
pub const BATCH_ID_HEADER: &str = "x-gpuledger-batch-id";

/// What the aggregator answers to a batch it accepted (`200` to `POST /api/v1/ingest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestResponse {
    /// The batch's id (absent from the answers of some older receivers: then nil).
    #[serde(default)]
    pub batch_id: Uuid,
    /// Samples in the batch.
    pub samples: u64,
    /// Samples stored now.
    pub stored: u64,
    /// Samples the ledger held already.
    pub duplicate_samples: u64,
    /// The batch id had been stored before.
    #[serde(default)]
    pub duplicate_batch: bool,
}

/// Time rules a batch must meet, as of one moment.
#[derive(Debug, Clone, Copy)]
pub struct TimeWindow {
    /// Newest second accepted (now + the allowed clock skew).
    pub newest: i64,
    /// Oldest second accepted (now − the rollup retention): older data would be deleted at once.
    pub oldest: i64,
}

impl TimeWindow {
    /// Checks every `t` of `batch`'s series and shares; the error names the field as a JSON path.
    pub fn check(&self, batch: &Batch) -> Result<(), (String, String)> {
        for (list, i, s) in batch.entries() {
            for (j, &t) in s.t.iter().enumerate() {
                if t > self.newest {
                    return Err((
                        format!("{list}[{i}].t[{j}]"),
                        format!(
                            "{t} is {} s in the future (more than the allowed clock skew); check the exporter's clock",
                            t.saturating_sub(self.newest)
                        ),
                    ));
                }
                if t < self.oldest {
                    return Err((
                        format!("{list}[{i}].t[{j}]"),
                        format!(
                            "{t} is older than the rollup retention (oldest accepted: {})",
                            self.oldest
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Somewhere checked batches can be sent and stored other than a ledger file: a running
/// aggregator's ingest API. `gpuledger import --aggregator` hands its batches to one (the ingest
/// client, `gpuledger-client`, implements it), so the ledger that checks them links no HTTP.
pub trait BatchSink: Send {
    /// Sends one batch, retrying what can be retried; the receiver's counts, or why it was not
    /// stored.
    fn send_batch<'a>(
        &'a mut self,
        batch: &'a Batch,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<IngestResponse, String>> + Send + 'a>>;
}

/// Whether a receiver's answer to a MessagePack body means it cannot read MessagePack at all: a
/// `415`, or a `400` whose error names the whole `body` (what an aggregator older than
/// MessagePack answers), or that this body is damaged: a sender that can decode the body itself
/// re-sends that batch as JSON under the same `batch_id`, and sends JSON for a while
/// (`schema/WIRE.md`, "MessagePack bodies").
pub fn msgpack_unread(status: u16, answer: &str) -> bool {
    let blames_the_body = || {
        crate::error::ErrorBody::parse(answer.as_bytes())
            .is_some_and(|a| a.error.field.as_deref() == Some("body"))
    };
    status == 415 || (status == 400 && blames_the_body())
}

/// Samples (and share seconds) one batch may hold by default: what an exporter's
/// `max_batch_samples` is set to. Receivers may configure their own [`Limits`].
pub const DEFAULT_MAX_BATCH_SAMPLES: usize = 50_000;

/// Bytes of decoded JSON allowed per sample: a second of every column, written out in full
/// (`t`, four ratios of up to 25 characters, four byte counts, `processes`), is under 200.
pub const DECODED_BYTES_PER_SAMPLE: usize = 256;
/// Bytes of decoded JSON allowed per series for its names and keys (a typical header is 300).
pub const DECODED_BYTES_PER_SERIES: usize = 1024;
/// Values allowed per sample (`t`, eight counters, `processes`, one to spare).
pub const VALUES_PER_SAMPLE: usize = 11;
/// Values allowed per series (its names, MIG fields and column keys).
pub const VALUES_PER_SERIES: usize = 32;

/// What a receiver reads of one batch. Every bound is derived from the number of samples a batch
/// may hold, so that the memory a request can cost is known before its body is parsed: a body
/// that inflates past [`Limits::max_decoded_bytes`] or holds more values (JSON or
/// MessagePack) than [`Limits::max_values`] is refused before any number is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Samples plus share seconds in one batch.
    pub max_samples: usize,
    /// Entries of `series` plus `shares` in one batch.
    pub max_series: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_samples: DEFAULT_MAX_BATCH_SAMPLES,
            max_series: 4096,
        }
    }
}

impl Limits {
    /// Largest decoded (inflated) body: 64 KiB, plus [`DECODED_BYTES_PER_SAMPLE`] per sample and
    /// [`DECODED_BYTES_PER_SERIES`] per series (17.1 MB for the defaults: 50,000 samples and 4,096 series).
    pub fn max_decoded_bytes(&self) -> usize {
        (64usize << 10)
            .saturating_add(self.max_samples.saturating_mul(DECODED_BYTES_PER_SAMPLE))
            .saturating_add(self.max_series.saturating_mul(DECODED_BYTES_PER_SERIES))
    }

    /// Most values in a body: JSON's array elements and object members, MessagePack's array
    /// elements and map entries.
    pub fn max_values(&self) -> usize {
        64usize
            .saturating_add(self.max_samples.saturating_mul(VALUES_PER_SAMPLE))
            .saturating_add(self.max_series.saturating_mul(VALUES_PER_SERIES))
    }
}

/// How a batch body is encoded under its gzip: the same fields either way (`schema/WIRE.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// `application/json`: readable, and what every receiver reads.
    Json,
    /// `application/vnd.msgpack`: numbers in binary, faster to decode than JSON
    /// (docs/perf/ingest.md, "A binary body: MessagePack"). What the exporter sends by default.
    #[default]
    #[serde(rename = "msgpack")]
    MessagePack,
}

impl Format {
    /// Both, as the names `--wire-format` takes.
    pub const ALL: [Format; 2] = [Format::Json, Format::MessagePack];

    /// The name in options and config files.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::MessagePack => "msgpack",
        }
    }

    /// The `Content-Type` of a body in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => CONTENT_TYPE,
            Format::MessagePack => MSGPACK_CONTENT_TYPE,
        }
    }

    /// The format a `Content-Type` names: JSON when there is none (what clients before
    /// MessagePack sent, or left out), `None` for a media type that is neither.
    pub fn of_content_type(value: Option<&str>) -> Option<Format> {
        let Some(value) = value else {
            return Some(Format::Json);
        };
        let media = value.split(';').next().unwrap_or("").trim();
        [
            ("application/json", Format::Json),
            (MSGPACK_CONTENT_TYPE, Format::MessagePack),
            ("application/msgpack", Format::MessagePack),
            ("application/x-msgpack", Format::MessagePack),
        ]
        .into_iter()
        .find(|(name, _)| media.eq_ignore_ascii_case(name))
        .map(|(_, f)| f)
    }

    /// The format of a body [`Batch::encode_as`] wrote, from its first byte: a JSON batch opens
    /// with `{`, a MessagePack one with a map marker. A spool written before MessagePack holds
    /// JSON, so the exporter asks the body rather than its own setting.
    pub fn of_body(body: &[u8], gzip: bool) -> Format {
        let mut first = [0u8; 1];
        let first = if gzip {
            GzDecoder::new(body)
                .read_exact(&mut first)
                .ok()
                .map(|()| first[0])
        } else {
            body.first().copied()
        };
        match first {
            Some(b) if b != b'{' && !b.is_ascii_whitespace() => Format::MessagePack,
            _ => Format::Json,
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Format::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a wire format: json or msgpack"))
    }
}

/// The lists of a batch whose entries are [`Series`]: what a JSON path to one starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    /// `series`: per-instance counters.
    Series,
    /// `shares`: per-process shares of an instance.
    Shares,
    /// `gpus`: per-GPU energy.
    Gpus,
}

impl List {
    /// The list's field name in the wire format.
    pub fn as_str(self) -> &'static str {
        match self {
            List::Series => "series",
            List::Shares => "shares",
            List::Gpus => "gpus",
        }
    }
}

impl std::fmt::Display for List {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A batch of samples from one exporter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// Wire version; see [`VERSION`].
    pub v: u32,
    /// Unique id of the batch; a receiver stores a batch id at most once. Read as text, or as
    /// the UUID's 16 bytes (what MessagePack bodies carry).
    #[serde(deserialize_with = "uuid_text_or_bytes")]
    pub batch_id: Uuid,
    /// The node that sent the batch (the node its token is for).
    pub node: String,
    /// The samples, grouped by instance and attribution.
    pub series: Vec<Series>,
    /// Per-owner use of shared instances, in the series shape: `sm_active` is the owner's part,
    /// `fb_used_bytes` its processes' memory, `processes` their count. Absent from batches of
    /// nodes without shared GPUs (and from exporters before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<Series>,
    /// Per-GPU readings, in the series shape with only `node`, `gpu_uuid`, `gpu_model`, `t` and
    /// `energy_joules` (the GPU's energy in each second). A GPU's second travels in the same
    /// batch as that GPU's instance samples of the second: the ledger splits it among them
    /// (`schema/ANALYTICS.md`, "Energy and carbon"). Absent from exporters before energy, whose
    /// GPU-seconds count as unmeasured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Series>,
}

/// The samples of one instance under one attribution, column-wise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Node of the instance (usually the batch's node; differs only in multi-node backfills).
    pub node: String,
    /// Physical GPU UUID.
    pub gpu_uuid: String,
    /// NVML product name.
    pub gpu_model: String,
    /// MIG profile; absent for a whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// MIG GPU instance id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    /// MIG placement start slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_start: Option<u32>,
    /// MIG placement size in slots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_size: Option<u32>,
    /// Tenant; absent when not allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// SLO class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_class: Option<SloClass>,
    /// Who the workload runs for (a pod's owner label or annotation, a Slurm job's user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// What the workload belongs to, `Kind/name` (`Job/train`, `Account/vision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_ref: Option<String>,
    /// The seconds (Unix) of the samples.
    #[serde(deserialize_with = "exact::column")]
    pub t: Vec<i64>,
    /// SM activity per second, 0–1.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "exact::optional_column"
    )]
    pub sm_active: Option<Vec<Option<f64>>>,
    /// SM occupancy per second, 0–1.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "exact::optional_column"
    )]
    pub sm_occupancy: Option<Vec<Option<f64>>>,
    /// Tensor-pipe activity per second, 0–1.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "exact::optional_column"
    )]
    pub tensor_active: Option<Vec<Option<f64>>>,
    /// DRAM bandwidth activity per second, 0–1.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "exact::optional_column"
    )]
    pub dram_active: Option<Vec<Option<f64>>>,
    /// HBM bytes used.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "exact::optional_column"
    )]
    pub fb_used_bytes: Option<Vec<Option<u64>>>,
    /// HBM bytes of the instance.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "exact::optional_column"
    )]
    pub fb_total_bytes: Option<Vec<Option<u64>>>,
    /// NVLink bytes sent during each second.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "exact::optional_column"
    )]
    pub nvlink_tx_bytes: Option<Vec<Option<u64>>>,
    /// NVLink bytes received during each second.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "exact::optional_column"
    )]
    pub nvlink_rx_bytes: Option<Vec<Option<u64>>>,
    /// Share series only: the owner's compute processes each second.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "exact::optional_column"
    )]
    pub processes: Option<Vec<u32>>,
    /// GPU series only: the GPU's energy in each second, joules (`None`: not measured).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "exact::optional_column"
    )]
    pub energy_joules: Option<Vec<Option<f64>>>,
}

/// A UUID from its text or its 16 bytes, whichever the format holds: `uuid`'s own reading takes
/// only bytes from a binary format, and a MessagePack writer may well send the text.
fn uuid_text_or_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Uuid, D::Error> {
    struct Either;
    impl serde::de::Visitor<'_> for Either {
        type Value = Uuid;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a UUID, as text or as its 16 bytes")
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Uuid, E> {
            Uuid::parse_str(v).map_err(E::custom)
        }

        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Uuid, E> {
            Uuid::from_slice(v).map_err(E::custom)
        }
    }
    d.deserialize_any(Either)
}

/// Columns decoded into vectors of their exact length.
///
/// serde's own `Vec` grows as elements come (JSON says no length ahead): a live 5 s column is
/// allocated at 4 and reallocated at 8, and `realloc` shows in the live load's profile, nearly
/// all on the request threads (docs/perf/ingest.md, "Decoding a live exporter's body"). Here up
/// to [`HEAD`](exact::HEAD) elements are read onto the stack, and a column that ends there is
/// allocated once, at its length; a longer one continues in a vector that starts with room for
/// four times as many.
mod exact {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};

    /// Elements read onto the stack before a vector is allocated.
    pub(super) const HEAD: usize = 16;

    /// A column, in a vector of its length.
    struct Column<T>(Vec<T>);

    impl<'de, T: Deserialize<'de> + Copy + Default> Deserialize<'de> for Column<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Elements<T>(PhantomData<T>);
            impl<'de, T: Deserialize<'de> + Copy + Default> Visitor<'de> for Elements<T> {
                type Value = Vec<T>;

                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a sequence")
                }

                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
                    let (mut head, mut n) = ([T::default(); HEAD], 0);
                    loop {
                        match seq.next_element()? {
                            None => return Ok(head[..n].to_vec()),
                            Some(v) if n < HEAD => {
                                head[n] = v;
                                n += 1;
                            }
                            Some(v) => {
                                let mut out = Vec::with_capacity(4 * HEAD);
                                out.extend_from_slice(&head);
                                out.push(v);
                                while let Some(v) = seq.next_element()? {
                                    out.push(v);
                                }
                                return Ok(out);
                            }
                        }
                    }
                }
            }
            d.deserialize_seq(Elements(PhantomData)).map(Column)
        }
    }

    /// A required column.
    pub(super) fn column<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Copy + Default,
    {
        Column::deserialize(d).map(|c| c.0)
    }

    /// A column that may be absent or `null`.
    pub(super) fn optional_column<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Copy + Default,
    {
        Option::<Column<T>>::deserialize(d).map(|c| c.map(|c| c.0))
    }
}

/// Why a body is not a valid batch. `field` is a JSON path such as `series[2].sm_active[7]`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    /// Not gzip, not JSON, or not the shape of a batch.
    #[error("body: {0}")]
    Malformed(String),
    /// A wire version this build does not read.
    #[error("v: unknown wire version {0} (this build reads version {VERSION})")]
    UnknownVersion(u32),
    /// The body holds more than a batch may (bytes, values, samples or series); 413.
    #[error("body: {0}")]
    TooLarge(String),
    /// A field breaks a rule.
    #[error("{field}: {problem}")]
    Invalid {
        /// JSON path of the field.
        field: String,
        /// What is wrong.
        problem: String,
    },
}

impl WireError {
    /// The JSON path of the offending field (`body` for an unparsable body).
    pub fn field(&self) -> &str {
        match self {
            WireError::Malformed(_) | WireError::TooLarge(_) => "body",
            WireError::UnknownVersion(_) => "v",
            WireError::Invalid { field, .. } => field,
        }
    }
}

impl Batch {
    /// Groups `samples` into a new batch with a fresh time-ordered id.
    pub fn from_samples(node: &str, samples: &[Sample]) -> Batch {
        let mut index: HashMap<(&Instance, &Attribution), usize> = HashMap::new();
        let mut groups: Vec<Vec<&Sample>> = Vec::new();
        for s in samples {
            let i = *index
                .entry((&s.instance, &s.attribution))
                .or_insert_with(|| {
                    groups.push(Vec::new());
                    groups.len() - 1
                });
            groups[i].push(s);
        }
        Batch {
            v: VERSION,
            batch_id: Uuid::now_v7(),
            node: node.to_owned(),
            series: groups.iter().map(|g| Series::from_samples(g)).collect(),
            shares: Vec::new(),
            gpus: Vec::new(),
        }
    }

    /// Adds per-GPU energy readings, one series per GPU. Each GPU-second should come with that
    /// GPU's instance samples of the second, in this batch.
    pub fn with_gpus(mut self, gpus: &[GpuSample]) -> Batch {
        let mut index: HashMap<(&str, &str), usize> = HashMap::new();
        for g in gpus {
            let i = *index
                .entry((g.node.as_str(), g.gpu_uuid.as_str()))
                .or_insert_with(|| {
                    self.gpus
                        .push(Series::of_gpu(&g.node, &g.gpu_uuid, &g.gpu_model));
                    self.gpus.len() - 1
                });
            let series = &mut self.gpus[i];
            series.t.push(g.timestamp);
            series
                .energy_joules
                .get_or_insert_default()
                .push(g.energy_joules);
        }
        self
    }

    /// Number of GPU-seconds in the batch's `gpus`.
    pub fn gpu_second_count(&self) -> usize {
        self.gpus.iter().map(|s| s.t.len()).sum()
    }

    /// Adds per-owner shares of shared instances, grouped like samples.
    pub fn with_shares(mut self, shares: &[ShareSample]) -> Batch {
        let mut index: HashMap<(&Instance, &Attribution), usize> = HashMap::new();
        for s in shares {
            let i = *index
                .entry((&s.instance, &s.attribution))
                .or_insert_with(|| {
                    let mut series = Series::from_samples(&[&Sample {
                        timestamp: s.timestamp,
                        instance: s.instance.clone(),
                        attribution: s.attribution.clone(),
                        counters: Counters::default(),
                    }]);
                    series.t.clear();
                    series.sm_active = Some(Vec::new());
                    series.fb_used_bytes = Some(Vec::new());
                    series.processes = Some(Vec::new());
                    self.shares.push(series);
                    self.shares.len() - 1
                });
            let series = &mut self.shares[i];
            series.t.push(s.timestamp);
            series.sm_active.get_or_insert_default().push(s.sm_active);
            series
                .fb_used_bytes
                .get_or_insert_default()
                .push(s.memory_used_bytes);
            series.processes.get_or_insert_default().push(s.processes);
        }
        self
    }

    /// Number of share seconds in the batch.
    pub fn share_count(&self) -> usize {
        self.shares.iter().map(|s| s.t.len()).sum()
    }

    /// Number of samples in the batch.
    pub fn sample_count(&self) -> usize {
        self.series.iter().map(|s| s.t.len()).sum()
    }

    /// The batch's earliest second, over its samples and shares; `None` when it has neither. A
    /// re-sent batch carries the same seconds, so the same earliest one: a receiver can look its
    /// id up among the batches of that second only.
    pub fn first_second(&self) -> Option<i64> {
        self.entries()
            .filter_map(|(_, _, s)| s.t.iter().min())
            .min()
            .copied()
    }

    /// Samples plus share seconds plus GPU-seconds: what the batch costs a receiver to hold and
    /// write.
    pub fn weight(&self) -> usize {
        self.sample_count() + self.share_count() + self.gpu_second_count()
    }

    /// Every entry of `series`, then `shares`, then `gpus`, with the list it is in and its index
    /// there: what a JSON path to one of them starts with.
    pub fn entries(&self) -> impl Iterator<Item = (List, usize, &Series)> {
        let series = self
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| (List::Series, i, s));
        let shares = self
            .shares
            .iter()
            .enumerate()
            .map(|(i, s)| (List::Shares, i, s));
        let gpus = self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, s)| (List::Gpus, i, s));
        series.chain(shares).chain(gpus)
    }

    /// The samples, series by series.
    pub fn samples(&self) -> impl Iterator<Item = Sample> + '_ {
        self.series.iter().flat_map(Series::samples)
    }

    /// gzip-compressed JSON.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(Format::Json)
    }

    /// gzip-compressed `format`, the body an exporter POSTs.
    pub fn encode_as(&self, format: Format) -> Vec<u8> {
        // Written whole, then compressed in one call: a serializer writing straight into the
        // encoder hands it every value as a write of its own.
        let mut doc = Vec::with_capacity(64 * self.sample_count() + 1024);
        match format {
            Format::Json => {
                serde_json::to_writer(&mut doc, self).expect("a batch always serializes")
            }
            Format::MessagePack => msgpack::write(&mut doc, self),
        }
        let mut gz = GzEncoder::new(Vec::with_capacity(doc.len() / 3), Compression::fast());
        gz.write_all(&doc).expect("writing to a Vec cannot fail");
        gz.finish().expect("writing to a Vec cannot fail")
    }

    /// Decodes and validates a body within the default [`Limits`].
    pub fn decode(body: &[u8], gzip: bool) -> Result<Batch, WireError> {
        Batch::decode_with(body, gzip, &Limits::default())
    }

    /// Decodes and validates a JSON body: gzip-compressed when `gzip`, else plain.
    pub fn decode_with(body: &[u8], gzip: bool, limits: &Limits) -> Result<Batch, WireError> {
        Batch::decode_as(body, gzip, Format::Json, limits)
    }

    /// Decodes and validates a body in `format`: gzip-compressed when `gzip`, else plain.
    /// Inflating stops at [`Limits::max_decoded_bytes`] and the values are counted before any is
    /// parsed, so what decoding costs is bounded by `limits` whatever the body holds.
    pub fn decode_as(
        body: &[u8],
        gzip: bool,
        format: Format,
        limits: &Limits,
    ) -> Result<Batch, WireError> {
        Batch::decode_within(body, gzip, format, limits, usize::MAX)
            .expect("no bound on the decoded bytes but the batch's own")
    }

    /// [`Batch::decode_as`], or `None` when the decoded document would be over `max_doc` bytes
    /// (a gzip body that says, in its trailer, or shows, while it inflates, that it is larger),
    /// without going past `max_doc` bytes of work. For a caller that decodes small bodies where
    /// it stands and hands the rest to another thread: a small body that inflates far (a gzip
    /// bomb) is handed on after `max_doc` bytes, not decoded in place up to the batch's limit.
    pub fn decode_within(
        body: &[u8],
        gzip: bool,
        format: Format,
        limits: &Limits,
        max_doc: usize,
    ) -> Option<Result<Batch, WireError>> {
        let max_bytes = limits.max_decoded_bytes();
        let inflated;
        let doc = if gzip {
            let hint = inflated_size_hint(body);
            if hint > max_doc {
                return None;
            }
            // Past `max_doc` (when it is the lower bound) the caller decodes the body again.
            let stop = max_bytes.min(max_doc);
            let mut out = Vec::with_capacity(hint.min(stop.saturating_add(1)));
            if let Err(e) = GzDecoder::new(body)
                .take((stop as u64).saturating_add(1))
                .read_to_end(&mut out)
            {
                return Some(Err(WireError::Malformed(format!("not valid gzip: {e}"))));
            }
            if out.len() > max_doc {
                return None;
            }
            inflated = out;
            &inflated[..]
        } else if body.len() > max_doc {
            return None;
        } else {
            body
        };
        Some(Batch::decode_document(doc, format, limits))
    }

    /// Decodes and validates an inflated document.
    fn decode_document(doc: &[u8], format: Format, limits: &Limits) -> Result<Batch, WireError> {
        let max_bytes = limits.max_decoded_bytes();
        let name = match format {
            Format::Json => "JSON",
            Format::MessagePack => "MessagePack",
        };
        if doc.len() > max_bytes {
            return Err(WireError::TooLarge(format!(
                "the batch is over {max_bytes} bytes of {name} (a batch holds at most {} samples)",
                limits.max_samples
            )));
        }
        // The JSON count is an upper bound; the MessagePack walk stops once past the limit.
        let values = match format {
            Format::Json => json_values_at_most(doc),
            Format::MessagePack => {
                msgpack::values_at_most(doc, limits.max_values()).map_err(WireError::Malformed)?
            }
        };
        if values > limits.max_values() {
            return Err(WireError::TooLarge(format!(
                "the body holds over {} {name} values (a batch holds at most {} samples)",
                limits.max_values(),
                limits.max_samples
            )));
        }
        let batch = match format {
            // Parsed without tracking the path (most of a parse's cost when it is tracked); a
            // body that fails is parsed again with the path, to name the field.
            Format::Json => match serde_json::from_slice(doc) {
                Ok(batch) => batch,
                Err(_) => Batch::parse_naming_the_field(doc)?,
            },
            Format::MessagePack => msgpack::parse(doc)?,
        };
        if batch.v != VERSION {
            return Err(WireError::UnknownVersion(batch.v));
        }
        let (weight, entries) = (
            batch.weight(),
            batch.series.len() + batch.shares.len() + batch.gpus.len(),
        );
        if weight > limits.max_samples {
            return Err(WireError::TooLarge(format!(
                "the batch holds {weight} samples, share seconds and GPU-seconds; at most {}",
                limits.max_samples
            )));
        }
        if entries > limits.max_series {
            return Err(WireError::TooLarge(format!(
                "the batch holds {entries} series, shares and GPU series; at most {}",
                limits.max_series
            )));
        }
        batch.validate()?;
        Ok(batch)
    }

    /// Parses a JSON body that plain parsing refused, to say where: the error names the
    /// field's path, or says the body is not JSON, or names an unknown wire version.
    fn parse_naming_the_field(json: &[u8]) -> Result<Batch, WireError> {
        let mut de = serde_json::Deserializer::from_slice(json);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            #[derive(Deserialize)]
            struct VersionOnly {
                v: u32,
            }
            match serde_json::from_slice::<VersionOnly>(json) {
                Ok(VersionOnly { v }) if v != VERSION => WireError::UnknownVersion(v),
                // A value of the wrong type (a negative byte count, a string for a ratio) is
                // named by its path; a body that is not JSON at all is the body's fault.
                _ if !e.inner().is_syntax()
                    && !e.inner().is_eof()
                    && e.path().iter().next().is_some() =>
                {
                    WireError::Invalid {
                        field: e.path().to_string(),
                        problem: e.inner().to_string(),
                    }
                }
                _ => WireError::Malformed(e.into_inner().to_string()),
            }
        })
    }

    /// Checks column lengths and every sample's rules.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.node.is_empty() {
            return Err(WireError::Invalid {
                field: "node".into(),
                problem: "must not be empty".into(),
            });
        }
        for (list, i, series) in self.entries() {
            series
                .validate(list)
                .map_err(|(field, j, problem)| WireError::Invalid {
                    field: match j {
                        Some(j) => format!("{list}[{i}].{field}[{j}]"),
                        None => format!("{list}[{i}].{field}"),
                    },
                    problem,
                })?;
        }
        Ok(())
    }
}

/// What a gzip body should inflate to: its trailer's size (ISIZE, the last four bytes), but never
/// more than deflate's largest ratio (1032:1) allows for the body. A fixed multiple of the body
/// would ask too much for a body that compresses little, and grow the buffer for one that
/// compresses past it (docs/perf/ingest.md, "Decoding a live exporter's body").
fn inflated_size_hint(body: &[u8]) -> usize {
    let trailer = body.len().checked_sub(4).map(|at| &body[at..]);
    let isize = trailer.map_or(0, |t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) as usize);
    isize.min(body.len().saturating_mul(1032))
}

/// An upper bound on the values (array elements, object members) in a JSON text: one more than
/// its commas outside strings. One pass over the bytes, before anything is allocated per value.
///
/// The pass takes 64 bytes at a time as bit masks (quotes, backslashes, commas; [`masks`]): the
/// bytes inside strings are the prefix XOR of the quote mask, and the commas outside are counted
/// with one popcount. A block with a backslash in it, or that starts escaped, goes byte by byte
/// ([`Scan::bytes`]), since an escaped quote does not end a string. Byte by byte, this pass is a
/// large part of decoding a live exporter's 5 s body (docs/perf/ingest.md, "Decoding a live
/// exporter's body").
fn json_values_at_most(json: &[u8]) -> usize {
    let mut scan = Scan::default();
    let mut blocks = json.chunks_exact(64);
    for block in &mut blocks {
        let [quotes, backslashes, commas] = masks(block, [b'"', b'\\', b',']);
        if backslashes != 0 || scan.escaped {
            scan.bytes(block);
            continue;
        }
        // Bit i of `inside` is the parity of the quotes at or before i, flipped when the block
        // starts inside a string: set for the bytes of a string (its closing quote excluded).
        let mut inside = quotes;
        for shift in [1, 2, 4, 8, 16, 32] {
            inside ^= inside << shift;
        }
        if scan.in_string {
            inside = !inside;
        }
        scan.commas += (commas & !inside).count_ones() as usize;
        scan.in_string ^= quotes.count_ones() % 2 == 1;
    }
    scan.bytes(blocks.remainder());
    scan.commas + 1
}

/// For each of `bytes`, the mask of where it is in a 64-byte `block` (bit i for byte i): SSE2
/// compares on x86-64 (its baseline), a plain loop elsewhere.
fn masks<const N: usize>(block: &[u8], bytes: [u8; N]) -> [u64; N] {
    debug_assert_eq!(block.len(), 64);
    let mut out = [0u64; N];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
        };
        for (k, lane) in block.chunks_exact(16).enumerate() {
            // SAFETY (this block and the next): SSE2 is part of every x86-64 CPU; `lane` is 16
            // readable bytes, and an unaligned load needs no alignment.
            let v = unsafe { _mm_loadu_si128(lane.as_ptr().cast()) };
            for (mask, &b) in out.iter_mut().zip(&bytes) {
                let hits = unsafe { _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8))) };
                *mask |= u64::from(hits as u16) << (16 * k);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (i, &c) in block.iter().enumerate() {
        for (mask, &b) in out.iter_mut().zip(&bytes) {
            *mask |= u64::from(c == b) << i;
        }
    }
    out
}

/// The state of [`json_values_at_most`] between blocks.
#[derive(Default)]
struct Scan {
    commas: usize,
    in_string: bool,
    escaped: bool,
}

impl Scan {
    /// Byte by byte: what the block-wise pass does where escapes are.
    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
            } else if b == b'"' {
                self.in_string = true;
            } else if b == b',' {
                self.commas += 1;
            }
        }
    }
}

fn column<T: Copy>(
    group: &[&Sample],
    get: impl Fn(&Counters) -> Option<T>,
) -> Option<Vec<Option<T>>> {
    let values: Vec<Option<T>> = group.iter().map(|s| get(&s.counters)).collect();
    values.iter().any(Option::is_some).then_some(values)
}

impl Series {
    /// A series with no samples that names `instance` held by `attribution` (the aggregator's
    /// minute rows refer to their instance and holder this way).
    pub fn describing(instance: &Instance, attribution: &Attribution) -> Series {
        Series::of(instance, attribution, &[])
    }

    fn from_samples(group: &[&Sample]) -> Series {
        Series::of(&group[0].instance, &group[0].attribution, group)
    }

    fn of(i: &Instance, a: &Attribution, group: &[&Sample]) -> Series {
        Series {
            node: i.node.clone(),
            gpu_uuid: i.gpu_uuid.clone(),
            gpu_model: i.gpu_model.clone(),
            mig_profile: i.mig_profile.clone(),
            gpu_instance_id: i.gpu_instance_id,
            placement_start: i.placement_start,
            placement_size: i.placement_size,
            tenant: a.tenant.clone(),
            workload: a.workload.clone(),
            slo_class: a.slo_class,
            owner: a.owner.clone(),
            owner_ref: a.owner_ref.clone(),
            t: group.iter().map(|s| s.timestamp).collect(),
            sm_active: column(group, |c| c.sm_active),
            sm_occupancy: column(group, |c| c.sm_occupancy),
            tensor_active: column(group, |c| c.tensor_active),
            dram_active: column(group, |c| c.dram_active),
            fb_used_bytes: column(group, |c| c.fb_used_bytes),
            fb_total_bytes: column(group, |c| c.fb_total_bytes),
            nvlink_tx_bytes: column(group, |c| c.nvlink_tx_bytes),
            nvlink_rx_bytes: column(group, |c| c.nvlink_rx_bytes),
            processes: None,
            energy_joules: None,
        }
    }

    /// An empty GPU series (`gpus`) of one GPU.
    fn of_gpu(node: &str, gpu_uuid: &str, gpu_model: &str) -> Series {
        let mut s = Series::of(
            &Instance {
                node: node.to_owned(),
                gpu_uuid: gpu_uuid.to_owned(),
                gpu_model: gpu_model.to_owned(),
                mig_profile: None,
                gpu_instance_id: None,
                placement_start: None,
                placement_size: None,
            },
            &Attribution::default(),
            &[],
        );
        s.energy_joules = Some(Vec::new());
        s
    }

    /// A GPU series (`gpus`) as GPU samples.
    pub fn gpu_samples(&self) -> impl Iterator<Item = GpuSample> + '_ {
        self.t
            .iter()
            .enumerate()
            .map(move |(j, &timestamp)| GpuSample {
                timestamp,
                node: self.node.clone(),
                gpu_uuid: self.gpu_uuid.clone(),
                gpu_model: self.gpu_model.clone(),
                energy_joules: self.energy_at(j),
            })
    }

    /// The GPU's energy in the `j`th second (GPU series only).
    pub fn energy_at(&self, j: usize) -> Option<f64> {
        self.energy_joules
            .as_ref()
            .and_then(|c| c.get(j).copied().flatten())
    }

    /// The series' instance.
    pub fn instance(&self) -> Instance {
        Instance {
            node: self.node.clone(),
            gpu_uuid: self.gpu_uuid.clone(),
            gpu_model: self.gpu_model.clone(),
            mig_profile: self.mig_profile.clone(),
            gpu_instance_id: self.gpu_instance_id,
            placement_start: self.placement_start,
            placement_size: self.placement_size,
        }
    }

    /// The series' attribution.
    pub fn attribution(&self) -> Attribution {
        Attribution {
            tenant: self.tenant.clone(),
            workload: self.workload.clone(),
            slo_class: self.slo_class,
            owner: self.owner.clone(),
            owner_ref: self.owner_ref.clone(),
        }
    }

    /// The counters of the `j`th second.
    pub fn counters(&self, j: usize) -> Counters {
        fn at<T: Copy>(col: &Option<Vec<Option<T>>>, j: usize) -> Option<T> {
            col.as_ref().and_then(|c| c.get(j).copied().flatten())
        }
        Counters {
            sm_active: at(&self.sm_active, j),
            sm_occupancy: at(&self.sm_occupancy, j),
            tensor_active: at(&self.tensor_active, j),
            dram_active: at(&self.dram_active, j),
            fb_used_bytes: at(&self.fb_used_bytes, j),
            fb_total_bytes: at(&self.fb_total_bytes, j),
            nvlink_tx_bytes: at(&self.nvlink_tx_bytes, j),
            nvlink_rx_bytes: at(&self.nvlink_rx_bytes, j),
        }
    }

    /// The series as samples.
    pub fn samples(&self) -> impl Iterator<Item = Sample> + '_ {
        let (instance, attribution) = (self.instance(), self.attribution());
        self.t
            .iter()
            .enumerate()
            .map(move |(j, &timestamp)| Sample {
                timestamp,
                instance: instance.clone(),
                attribution: attribution.clone(),
                counters: self.counters(j),
            })
    }

    /// The share series as share samples.
    pub fn shares(&self) -> impl Iterator<Item = ShareSample> + '_ {
        let (instance, attribution) = (self.instance(), self.attribution());
        self.t
            .iter()
            .enumerate()
            .map(move |(j, &timestamp)| ShareSample {
                timestamp,
                instance: instance.clone(),
                attribution: attribution.clone(),
                processes: self
                    .processes
                    .as_ref()
                    .and_then(|p| p.get(j).copied())
                    .unwrap_or(0),
                memory_used_bytes: self.counters(j).fb_used_bytes,
                sm_active: self.counters(j).sm_active,
            })
    }

    fn validate(&self, list: List) -> Result<(), (&'static str, Option<usize>, String)> {
        let n = self.t.len();
        if n == 0 {
            return Err(("t", None, "must hold at least one second".into()));
        }
        if list == List::Gpus {
            return self.validate_gpu();
        }
        if self.energy_joules.is_some() {
            return Err((
                "energy_joules",
                None,
                "belongs to gpus, not to instance series".into(),
            ));
        }
        let share = list == List::Shares;
        match (share, &self.processes) {
            (true, None) => return Err(("processes", None, "is required in a share".into())),
            (false, Some(_)) => {
                return Err((
                    "processes",
                    None,
                    "belongs to shares, not to sample series".into(),
                ));
            }
            _ => {}
        }
        let lengths = [
            ("sm_active", self.sm_active.as_ref().map(Vec::len)),
            ("sm_occupancy", self.sm_occupancy.as_ref().map(Vec::len)),
            ("tensor_active", self.tensor_active.as_ref().map(Vec::len)),
            ("dram_active", self.dram_active.as_ref().map(Vec::len)),
            ("fb_used_bytes", self.fb_used_bytes.as_ref().map(Vec::len)),
            ("fb_total_bytes", self.fb_total_bytes.as_ref().map(Vec::len)),
            (
                "nvlink_tx_bytes",
                self.nvlink_tx_bytes.as_ref().map(Vec::len),
            ),
            (
                "nvlink_rx_bytes",
                self.nvlink_rx_bytes.as_ref().map(Vec::len),
            ),
            ("processes", self.processes.as_ref().map(Vec::len)),
        ];
        for (field, len) in lengths {
            if let Some(len) = len
                && len != n
            {
                return Err((
                    field,
                    None,
                    format!("has {len} values for {n} seconds in t"),
                ));
            }
        }
        // The series-wide rules once (names, MIG fields, attribution), then the counters of each
        // second: no per-second copy of the series' strings.
        Sample {
            timestamp: self.t[0],
            instance: self.instance(),
            attribution: self.attribution(),
            counters: Counters::default(),
        }
        .validate()
        .map_err(|InvalidField { field, problem }| (field, None, problem))?;
        for j in 0..n {
            self.counters(j)
                .validate()
                .map_err(|InvalidField { field, problem }| (field, Some(j), problem))?;
        }
        // The ledger keeps a count in an INTEGER (`shares_raw.processes`).
        // (See `validate_gpu` for `gpus`.)
        if let Some(j) = self
            .processes
            .iter()
            .flatten()
            .position(|&p| p > i32::MAX as u32)
        {
            return Err((
                "processes",
                Some(j),
                format!("must be at most {}", i32::MAX),
            ));
        }
        Ok(())
    }

    /// The rules of a GPU series: the GPU's names, no instance or holder fields, and an
    /// `energy_joules` column of finite values within 0..=[`MAX_GPU_JOULES_PER_SECOND`].
    fn validate_gpu(&self) -> Result<(), (&'static str, Option<usize>, String)> {
        let n = self.t.len();
        Sample {
            timestamp: self.t[0],
            instance: self.instance(),
            attribution: Attribution::default(),
            counters: Counters::default(),
        }
        .validate()
        .map_err(|InvalidField { field, problem }| (field, None, problem))?;
        let extra = [
            ("mig_profile", self.mig_profile.is_some()),
            ("gpu_instance_id", self.gpu_instance_id.is_some()),
            ("placement_start", self.placement_start.is_some()),
            ("placement_size", self.placement_size.is_some()),
            ("tenant", self.tenant.is_some()),
            ("workload", self.workload.is_some()),
            ("slo_class", self.slo_class.is_some()),
            ("owner", self.owner.is_some()),
            ("owner_ref", self.owner_ref.is_some()),
            ("sm_active", self.sm_active.is_some()),
            ("sm_occupancy", self.sm_occupancy.is_some()),
            ("tensor_active", self.tensor_active.is_some()),
            ("dram_active", self.dram_active.is_some()),
            ("fb_used_bytes", self.fb_used_bytes.is_some()),
            ("fb_total_bytes", self.fb_total_bytes.is_some()),
            ("nvlink_tx_bytes", self.nvlink_tx_bytes.is_some()),
            ("nvlink_rx_bytes", self.nvlink_rx_bytes.is_some()),
            ("processes", self.processes.is_some()),
        ];
        if let Some((field, _)) = extra.iter().find(|(_, present)| *present) {
            return Err((
                field,
                None,
                "belongs to instance series, not to gpus (a GPU series has node, gpu_uuid, gpu_model, t and energy_joules)".into(),
            ));
        }
        let Some(energy) = &self.energy_joules else {
            return Err(("energy_joules", None, "is required in gpus".into()));
        };
        if energy.len() != n {
            return Err((
                "energy_joules",
                None,
                format!("has {} values for {n} seconds in t", energy.len()),
            ));
        }
        for (j, e) in energy.iter().enumerate() {
            if let Some(e) = *e
                && !(e.is_finite() && (0.0..=MAX_GPU_JOULES_PER_SECOND).contains(&e))
            {
                return Err((
                    "energy_joules",
                    Some(j),
                    format!(
                        "{e} J in one second is not an energy a GPU uses (0 to {MAX_GPU_JOULES_PER_SECOND})"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_415_or_a_400_blaming_the_body_means_msgpack_is_unread() {
        use super::msgpack_unread;
        let body = r#"{"error":{"field":"body","message":"not JSON"}}"#;
        let field = r#"{"error":{"field":"series[0].t[1]","message":"not a second"}}"#;
        assert!(msgpack_unread(415, ""));
        assert!(msgpack_unread(400, body));
        assert!(
            !msgpack_unread(400, field),
            "a bad value is the batch's fault"
        );
        assert!(!msgpack_unread(400, "not json"));
        assert!(!msgpack_unread(413, body));
    }

    use super::*;

    fn sample(t: i64, gi: u32, tenant: Option<&str>, sm: Option<f64>) -> Sample {
        Sample {
            timestamp: t,
            instance: Instance {
                node: "n1".into(),
                gpu_uuid: "GPU-a".into(),
                gpu_model: "NVIDIA H100 80GB HBM3".into(),
                mig_profile: Some("1g.10gb".into()),
                gpu_instance_id: Some(gi),
                // A 1g.10gb instance starts at slot 0 to 6.
                placement_start: Some(gi % 7),
                placement_size: Some(1),
            },
            attribution: Attribution {
                tenant: tenant.map(Into::into),
                workload: None,
                slo_class: None,
                owner: None,
                owner_ref: None,
            },
            counters: Counters {
                sm_active: sm,
                fb_total_bytes: Some(10),
                ..Counters::default()
            },
        }
    }

    #[test]
    fn samples_round_trip_through_the_wire() {
        let samples = vec![
            sample(1, 7, Some("a"), Some(0.5)),
            sample(1, 8, None, None),
            sample(2, 7, Some("a"), None),
            sample(2, 8, None, None),
            sample(3, 7, Some("b"), Some(1.0)),
        ];
        let batch = Batch::from_samples("n1", &samples);
        assert_eq!(batch.series.len(), 3, "a tenant change starts a new series");
        assert!(
            batch.series[1].sm_active.is_none(),
            "an unmeasured column is left out"
        );
        let decoded = Batch::decode(&batch.encode(), true).unwrap();
        assert_eq!(decoded, batch);
        let mut back: Vec<Sample> = decoded.samples().collect();
        back.sort_by_key(|s| (s.timestamp, s.instance.gpu_instance_id));
        assert_eq!(back, samples);
    }

    /// Columns of every length around the stack head decode to their values, in vectors of
    /// their length; a `null` column is an absent one, and a column of the wrong type is named.
    #[test]
    fn columns_decode_at_their_exact_length() {
        for len in [
            0,
            1,
            5,
            exact::HEAD - 1,
            exact::HEAD,
            exact::HEAD + 1,
            4 * exact::HEAD + 3,
        ] {
            let samples: Vec<Sample> = (0..len as i64)
                .map(|t| sample(t, 7, Some("a"), (t % 3 != 0).then_some(0.25)))
                .collect();
            let batch = Batch::from_samples("n1", &samples);
            let decoded = Batch::decode(&batch.encode(), true).unwrap();
            assert_eq!(decoded, batch, "{len} seconds");
            for s in decoded.series.iter().filter(|s| s.t.len() <= exact::HEAD) {
                assert_eq!(s.t.capacity(), s.t.len());
                // A column with nothing measured (one second, at t = 0) is left out.
                if let Some(column) = &s.sm_active {
                    assert_eq!(column.capacity(), s.t.len());
                }
            }
        }
        let body = |column: &str| {
            format!(
                r#"{{"v":1,"batch_id":"01a2057d-f974-7779-95df-9092985a68aa","node":"n","series":[{{"node":"n","gpu_uuid":"GPU-a","gpu_model":"m","t":[1,2],"sm_active":{column}}}]}}"#
            )
        };
        let decoded = Batch::decode(body("null").as_bytes(), false).unwrap();
        assert_eq!(decoded.series[0].sm_active, None);
        let decoded = Batch::decode(body("[0.5,null]").as_bytes(), false).unwrap();
        assert_eq!(decoded.series[0].sm_active, Some(vec![Some(0.5), None]));
        let e = Batch::decode(body(r#"[0.5,"x"]"#).as_bytes(), false).unwrap_err();
        assert_eq!(e.field(), "series[0].sm_active[1]", "{e}");
        let e = Batch::decode(body("7").as_bytes(), false).unwrap_err();
        assert_eq!(e.field(), "series[0].sm_active", "{e}");
    }

    #[test]
    fn shares_round_trip_and_are_checked_like_samples() {
        let share = |t, tenant: Option<&str>, sm| ShareSample {
            timestamp: t,
            instance: sample(t, 7, None, None).instance,
            attribution: Attribution {
                tenant: tenant.map(Into::into),
                ..Attribution::default()
            },
            processes: 2,
            memory_used_bytes: Some(1 << 30),
            sm_active: sm,
        };
        let shares = vec![
            share(1, Some("a"), Some(0.25)),
            share(1, None, None),
            share(2, Some("a"), Some(0.5)),
        ];
        let batch =
            Batch::from_samples("n1", &[sample(1, 7, None, Some(0.75))]).with_shares(&shares);
        assert_eq!((batch.shares.len(), batch.share_count()), (2, 3));
        let decoded = Batch::decode(&batch.encode(), true).unwrap();
        let mut back: Vec<ShareSample> = decoded.shares.iter().flat_map(Series::shares).collect();
        back.sort_by_key(|s| (s.timestamp, s.attribution.tenant.is_none()));
        assert_eq!(back, shares);

        let mut json: serde_json::Value = serde_json::to_value(&batch).unwrap();
        json["shares"][0]["sm_active"][1] = serde_json::json!(2.0);
        let err = Batch::decode(json.to_string().as_bytes(), false).unwrap_err();
        assert_eq!(err.field(), "shares[0].sm_active[1]");
        let mut json: serde_json::Value = serde_json::to_value(&batch).unwrap();
        json["shares"][1]
            .as_object_mut()
            .unwrap()
            .remove("processes");
        let err = Batch::decode(json.to_string().as_bytes(), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "shares[1].processes: is required in a share"
        );
        let mut json: serde_json::Value = serde_json::to_value(&batch).unwrap();
        json["shares"][1]["processes"][0] = serde_json::json!(u32::MAX);
        let err = Batch::decode(json.to_string().as_bytes(), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "shares[1].processes[0]: must be at most 2147483647"
        );
        // A batch without shares (an older exporter's) has no `shares` key and decodes.
        let plain = Batch::from_samples("n1", &[sample(1, 7, None, None)]);
        assert!(
            !String::from_utf8(serde_json::to_vec(&plain).unwrap())
                .unwrap()
                .contains("shares")
        );
    }

    /// Regression: a 255 KiB gzip body inflating to 256 MiB of `"t":[0,0,…]` was decoded into
    /// 1.3 GiB of numbers. Now the inflated size and the value count are bounded by what a batch
    /// may hold, and checked before any value is parsed.
    #[test]
    fn a_gzip_bomb_of_zeros_is_refused_before_it_is_parsed() {
        use std::io::Write;
        let limits = Limits {
            max_samples: 1000,
            max_series: 10,
        };
        let mut gz = GzEncoder::new(Vec::new(), Compression::best());
        gz.write_all(br#"{"v":1,"batch_id":"01a2057d-f974-7779-95df-9092985a68aa","node":"n","series":[{"t":["#)
            .unwrap();
        let zeros = b"0,".repeat(1 << 20);
        for _ in 0..64 {
            gz.write_all(&zeros).unwrap();
        }
        gz.write_all(b"0]}]}").unwrap();
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 512 << 10, "{} bytes", bomb.len());
        let e = Batch::decode_with(&bomb, true, &limits).unwrap_err();
        assert!(matches!(e, WireError::TooLarge(_)), "{e}");
        // Within the byte bound but past the value bound: still refused before parsing.
        let small = format!(
            r#"{{"v":1,"batch_id":"01a2057d-f974-7779-95df-9092985a68aa","node":"n","series":[{{"t":[{}0]}}]}}"#,
            "0,".repeat(limits.max_values())
        );
        assert!(small.len() <= limits.max_decoded_bytes());
        let e = Batch::decode_with(small.as_bytes(), false, &limits).unwrap_err();
        assert!(e.to_string().contains("JSON values"), "{e}");
        // Commas inside strings are not values.
        assert_eq!(json_values_at_most(br#"["a,b,\",c", 1]"#), 2);
    }

    /// `decode_within` decodes what fits its document bound as `decode_as` does, and hands back
    /// (`None`) a body whose document would not, whether its gzip trailer says so or lies.
    #[test]
    fn a_body_past_the_document_bound_is_handed_back_undecoded() {
        use std::io::Write;
        let limits = Limits::default();
        let batch = Batch::from_samples("n1", &[sample(1_700_000_000, 1, Some("a"), Some(0.5))]);
        let json = serde_json::to_vec(&batch).unwrap();
        let gz = |doc: &[u8]| {
            let mut gz = GzEncoder::new(Vec::new(), Compression::best());
            gz.write_all(doc).unwrap();
            gz.finish().unwrap()
        };
        let within = |body: &[u8], gzip: bool| {
            Batch::decode_within(body, gzip, Format::Json, &limits, 64 << 10)
        };
        // Fits: the same batch as `decode_as`.
        assert_eq!(within(&gz(&json), true).unwrap().unwrap(), batch);
        assert_eq!(within(&json, false).unwrap().unwrap(), batch);
        assert!(matches!(
            within(b"not gzip", true),
            Some(Err(WireError::Malformed(_)))
        ));
        // 1 MiB of JSON (trailing spaces), a few KiB of gzip.
        let mut padded = json.clone();
        padded.resize(1 << 20, b' ');
        let big = gz(&padded);
        assert!(big.len() < 8 << 10, "{} bytes", big.len());
        assert!(within(&big, true).is_none(), "the trailer says 1 MiB");
        let mut lying = big.clone();
        let at = lying.len() - 4;
        lying[at..].copy_from_slice(&1000u32.to_le_bytes());
        assert!(within(&lying, true).is_none(), "inflating shows it");
        assert!(within(&padded, false).is_none());
        // Handed on, the body decodes within the batch's own bound.
        assert_eq!(
            Batch::decode_as(&big, true, Format::Json, &limits).unwrap(),
            batch
        );
    }

    /// The block-wise count equals the byte-by-byte one, for texts with strings, escaped quotes
    /// and backslashes across block boundaries, and a backslash outside a string (not JSON, but
    /// the count must still be an upper bound the parser then refuses).
    #[test]
    fn values_are_counted_the_same_block_wise_and_byte_wise() {
        let by_bytes = |json: &[u8]| {
            let mut scan = Scan::default();
            scan.bytes(json);
            scan.commas + 1
        };
        let pieces: [&[u8]; 9] = [
            b",",
            b"\"",
            b"\\",
            b"a",
            b"0,1,2,3",
            b"\"x,y\"",
            br#""\",""#,
            br#"\\"#,
            b"[{}]",
        ];
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for len in 0..400 {
            let mut text = Vec::new();
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.extend_from_slice(pieces[(state % pieces.len() as u64) as usize]);
            }
            assert_eq!(
                json_values_at_most(&text),
                by_bytes(&text),
                "{}",
                String::from_utf8_lossy(&text)
            );
        }
        // A string that runs across a block boundary: its commas are not values.
        let long = format!(r#"[{}"{}",1]"#, "0,".repeat(20), "a,".repeat(60));
        assert_eq!(json_values_at_most(long.as_bytes()), 22);
    }

    /// Regression: share seconds did not count against a batch's size.
    #[test]
    fn shares_count_against_the_batch_limit() {
        let share = |t| ShareSample {
            timestamp: t,
            instance: sample(t, 7, None, None).instance,
            attribution: Attribution::default(),
            processes: 1,
            memory_used_bytes: None,
            sm_active: None,
        };
        let shares: Vec<ShareSample> = (0..20).map(share).collect();
        let batch = Batch::from_samples("n1", &[sample(1, 7, None, None)]).with_shares(&shares);
        let limits = Limits {
            max_samples: 20,
            max_series: 10,
        };
        let e = Batch::decode_with(&batch.encode(), true, &limits).unwrap_err();
        assert!(
            e.to_string()
                .contains("21 samples, share seconds and GPU-seconds"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let batch = Batch::from_samples(
            "n1",
            &[
                sample(1, 7, Some("a"), Some(0.5)),
                sample(2, 7, Some("a"), Some(0.5)),
            ],
        );
        let mut json: serde_json::Value = serde_json::to_value(&batch).unwrap();
        json["series"][0]["sm_active"][1] = serde_json::json!(1.25);
        let err = Batch::decode(json.to_string().as_bytes(), false).unwrap_err();
        assert_eq!(err.field(), "series[0].sm_active[1]");

        json["series"][0]["sm_active"] = serde_json::json!([0.5]);
        let err = Batch::decode(json.to_string().as_bytes(), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "series[0].sm_active: has 1 values for 2 seconds in t"
        );

        json["v"] = serde_json::json!(2);
        json["series"] = serde_json::json!("changed shape in v2");
        assert_eq!(
            Batch::decode(json.to_string().as_bytes(), false).unwrap_err(),
            WireError::UnknownVersion(2)
        );

        // A value of the wrong type is named by its path, not blamed on the whole body.
        json["v"] = serde_json::json!(1);
        assert_eq!(
            Batch::decode(json.to_string().as_bytes(), false)
                .unwrap_err()
                .field(),
            "series"
        );
        let mut json: serde_json::Value = serde_json::to_value(&batch).unwrap();
        json["series"][0]["t"][1] = serde_json::json!("soon");
        let err = Batch::decode(json.to_string().as_bytes(), false).unwrap_err();
        assert_eq!(err.field(), "series[0].t[1]", "{err}");
        assert_eq!(
            Batch::decode(b"{\"v\": 1, \"batch_id\"", false)
                .unwrap_err()
                .field(),
            "body"
        );
        assert_eq!(
            Batch::decode(b"not gzip", true).unwrap_err().field(),
            "body"
        );
    }
}
