//! The services' options, declared once. An options struct derives `clap::Args` (the flags),
//! `serde` (the keys of the `--config` TOML file, the flag's long name with `_` for `-`) and
//! nothing else: [`layered`] puts the flags over the file by serializing the flags that were
//! given and laying them over the file's table, so no option is listed a second time in a merge
//! function. The environment (`GPULEDGER_<COMMAND>_<FLAG>`) reaches the flags through clap.
//!
//! Order: a flag (or its environment variable) wins over the file, which wins over the default.
//! A flag that was not given serializes as nothing, an empty list or `false`, and leaves the
//! file's value alone; lists and `KEY=VALUE` tables from flags replace the file's list, and the
//! file's table entries of the same key.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A humantime duration in TOML (`"15m"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub std::time::Duration);

impl<'de> serde::Deserialize<'de> for Span {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        humantime::parse_duration(&s)
            .map(Span)
            .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration: {e}")))
    }
}

/// A config file that cannot be used; the message names the file and, from TOML, the key.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A key is unknown or its value has the wrong type.
    #[error("config file {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// TOML's message: line, column and key.
        message: String,
    },
    /// A flag's value cannot be laid over the file: TOML holds integers up to 2^63 − 1 and
    /// UTF-8 text only.
    #[error(
        "a flag's value cannot be used (integers up to 9223372036854775807, UTF-8 paths): {message}"
    )]
    Flag {
        /// Why, in TOML's words.
        message: String,
    },
}

/// `flags` over the config file at `file` (none: the flags alone).
pub fn layered<T: Serialize + DeserializeOwned>(
    flags: &T,
    file: Option<&Path>,
) -> Result<T, OptionsError> {
    let flag_table = toml::Table::try_from(flags).map_err(|e| OptionsError::Flag {
        message: e.to_string(),
    })?;
    let mut table = match file {
        None => toml::Table::new(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| OptionsError::Read {
                path: path.to_owned(),
                source,
            })?;
            let invalid = |e: toml::de::Error| OptionsError::Invalid {
                path: path.to_owned(),
                message: e.to_string().trim_end().to_owned(),
            };
            // Parsed into T alone first, so that an unknown key or a wrong type is reported
            // with the file's line and column.
            toml::from_str::<T>(&text).map_err(invalid)?;
            text.parse::<toml::Table>().map_err(invalid)?
        }
    };
    overlay(&mut table, flag_table);
    T::deserialize(toml::Value::Table(table)).map_err(|e| OptionsError::Flag {
        message: e.to_string(),
    })
}

/// `flags` over `file`, both already read: for options nested in a larger file that is read
/// elsewhere (a table of it).
pub fn over<T: Serialize + DeserializeOwned>(flags: &T, file: &T) -> Result<T, OptionsError> {
    let table = |t: &T| {
        toml::Table::try_from(t).map_err(|e| OptionsError::Flag {
            message: e.to_string(),
        })
    };
    let mut base = table(file)?;
    overlay(&mut base, table(flags)?);
    T::deserialize(toml::Value::Table(base)).map_err(|e| OptionsError::Flag {
        message: e.to_string(),
    })
}

fn given(v: &toml::Value) -> bool {
    match v {
        toml::Value::Array(a) => !a.is_empty(),
        toml::Value::Table(t) => !t.is_empty(),
        toml::Value::Boolean(b) => *b,
        _ => true,
    }
}

fn overlay(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        if !given(&value) {
            continue;
        }
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => overlay(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Parses a `KEY=VALUE` flag (clap `value_parser`); the value with `V`'s `FromStr`.
pub fn pair<V>(s: &str) -> Result<(String, V), String>
where
    V: FromStr,
    V::Err: std::fmt::Display,
{
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))?;
    let v = v.parse().map_err(|e| format!("{s:?}: {e}"))?;
    Ok((k.trim().to_owned(), v))
}

/// Repeated `KEY=VALUE` flags as one table of the config file (`with = "options::pairs"`).
pub mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes the pairs as a table.
    pub fn serialize<S: Serializer, V: Serialize>(
        pairs: &[(String, V)],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
    }

    /// Reads a table as pairs, in key order.
    pub fn deserialize<'de, D: Deserializer<'de>, V: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<(String, V)>, D::Error> {
        Ok(BTreeMap::<String, V>::deserialize(d)?.into_iter().collect())
    }
}

/// An optional duration as humantime text (`"5s"`, `"400days"`) in the config file
/// (`with = "options::duration"`); the flag takes the same text (`humantime::parse_duration`).
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the duration as humantime text.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_none(),
        }
    }

    /// Reads humantime text.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| {
                humantime::parse_duration(&s)
                    .map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::time::Duration;

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Opts {
        name: Option<String>,
        on: bool,
        list: Vec<String>,
        #[serde(with = "pairs")]
        map: Vec<(String, u32)>,
        #[serde(with = "duration")]
        every: Option<Duration>,
        #[serde(skip_serializing_if = "Inner::is_empty")]
        inner: Inner,
    }

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Inner {
        url: Option<String>,
        #[serde(with = "duration")]
        timeout: Option<Duration>,
    }

    impl Inner {
        fn is_empty(&self) -> bool {
            self == &Inner::default()
        }
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn flags_win_and_absent_flags_leave_the_file_alone() {
        let (_d, path) = file(
            "name = \"file\"\non = true\nlist = [\"a\"]\nevery = \"5s\"\n[map]\nx = 1\ny = 2\n[inner]\nurl = \"u\"\ntimeout = \"1s\"\n",
        );
        let flags = Opts {
            map: vec![("y".into(), 3)],
            inner: Inner {
                timeout: Some(Duration::from_secs(2)),
                ..Inner::default()
            },
            ..Opts::default()
        };
        let got = layered(&flags, Some(&path)).unwrap();
        assert_eq!(
            got,
            Opts {
                name: Some("file".into()),
                on: true,
                list: vec!["a".into()],
                map: vec![("x".into(), 1), ("y".into(), 3)],
                every: Some(Duration::from_secs(5)),
                inner: Inner {
                    url: Some("u".into()),
                    timeout: Some(Duration::from_secs(2)),
                },
            }
        );
        let flags = Opts {
            name: Some("flag".into()),
            list: vec!["b".into()],
            every: Some(Duration::from_secs(60)),
            ..Opts::default()
        };
        let got = layered(&flags, Some(&path)).unwrap();
        assert_eq!(
            (got.name.as_deref(), got.list, got.every),
            (
                Some("flag"),
                vec!["b".to_owned()],
                Some(Duration::from_secs(60))
            )
        );
        assert_eq!(layered(&flags, None).unwrap().name.as_deref(), Some("flag"));
    }

    #[test]
    fn file_errors_name_the_file_and_the_key() {
        let (_d, path) = file("nmae = \"x\"\n");
        let e = layered(&Opts::default(), Some(&path))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("c.toml") && e.contains("unknown field `nmae`"),
            "{e}"
        );
        let (_d, path) = file("every = \"soon\"\n");
        let e = layered(&Opts::default(), Some(&path))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("c.toml") && e.contains("every") && e.contains("soon"),
            "{e}"
        );
        let e = layered(&Opts::default(), Some(Path::new("/nonexistent.toml")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent.toml"), "{e}");
        assert_eq!(pair::<u32>("a=1"), Ok(("a".into(), 1)));
        assert!(pair::<u32>("a").is_err() && pair::<u32>("a=x").is_err());
    }
}
