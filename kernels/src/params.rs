//! Packer parameters: `key=value` strings, validated against each packer's
//! [`ParamSpec`] list (unknown keys and values outside the allowed set are
//! refused, missing keys take their default).

use std::collections::BTreeMap;

use crate::error::PackError;

/// One accepted parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSpec {
    /// The key, as written in `key=value`.
    pub name: &'static str,
    /// Every accepted value, spelled as it must be written.
    pub allowed: &'static [&'static str],
    /// The value used when the key is not given.
    pub default: &'static str,
    /// One line for humans (listed by the CLI with the packers).
    pub doc: &'static str,
}

/// Parameters as given by the user: key -> value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params(BTreeMap<String, String>);

impl Params {
    /// No parameters: every packer then uses its defaults.
    pub fn new() -> Params {
        Params::default()
    }

    /// Parses `key=value` items; a key given twice is an error.
    pub fn parse<I, S>(items: I) -> Result<Params, PackError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut map = BTreeMap::new();
        for item in items {
            let item = item.as_ref().trim();
            if item.is_empty() {
                continue;
            }
            let (k, v) = item
                .split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .ok_or_else(|| PackError::MalformedParam(item.to_string()))?;
            let k = k.trim().to_string();
            if map.insert(k.clone(), v.trim().to_string()).is_some() {
                return Err(PackError::DuplicateParam(k));
            }
        }
        Ok(Params(map))
    }

    /// Sets `key` (replacing any earlier value).
    pub fn with(mut self, key: &str, value: &str) -> Params {
        self.0.insert(key.to_string(), value.to_string());
        self
    }

    /// The value given for `key`, if any (defaults are applied by the packer).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The given parameters in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Validates against `spec` and returns a view with defaults filled in.
    pub(crate) fn resolve(
        &self,
        packer: &'static str,
        spec: &'static [ParamSpec],
    ) -> Result<Resolved<'_>, PackError> {
        for (k, v) in &self.0 {
            let s = spec
                .iter()
                .find(|s| s.name == k)
                .ok_or_else(|| PackError::UnknownParam {
                    packer,
                    name: k.clone(),
                    known: spec.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
                })?;
            if !s.allowed.contains(&v.as_str()) {
                return Err(PackError::BadParamValue {
                    packer,
                    name: s.name,
                    value: v.clone(),
                    allowed: s.allowed.join(", "),
                });
            }
        }
        Ok(Resolved { spec, params: self })
    }
}

/// Parameters after validation: every spec'd key has a value.
pub(crate) struct Resolved<'a> {
    spec: &'static [ParamSpec],
    params: &'a Params,
}

impl Resolved<'_> {
    pub(crate) fn str(&self, name: &str) -> &str {
        match self.params.get(name) {
            Some(v) => v,
            None => {
                self.spec
                    .iter()
                    .find(|s| s.name == name)
                    .expect("packer asks only for its own parameters")
                    .default
            }
        }
    }

    /// An integer parameter (its allowed values are all integers).
    pub(crate) fn u32(&self, name: &str) -> u32 {
        self.str(name)
            .parse()
            .expect("allowed values of integer parameters are integers")
    }

    /// A `true`/`false` parameter.
    pub(crate) fn bool(&self, name: &str) -> bool {
        self.str(name) == "true"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &[ParamSpec] = &[
        ParamSpec {
            name: "bits",
            allowed: &["4", "8"],
            default: "4",
            doc: "",
        },
        ParamSpec {
            name: "symmetric",
            allowed: &["true", "false"],
            default: "true",
            doc: "",
        },
    ];

    #[test]
    fn parse_and_resolve() {
        let p = Params::parse(["bits=8", " symmetric = false "]).unwrap();
        let r = p.resolve("t", SPEC).unwrap();
        assert_eq!(r.u32("bits"), 8);
        assert!(!r.bool("symmetric"));
        let d = Params::new();
        let r = d.resolve("t", SPEC).unwrap();
        assert_eq!(r.u32("bits"), 4);
        assert!(r.bool("symmetric"));
    }

    #[test]
    fn refusals() {
        assert_eq!(
            Params::parse(["bits"]),
            Err(PackError::MalformedParam("bits".into()))
        );
        assert_eq!(
            Params::parse(["=4"]),
            Err(PackError::MalformedParam("=4".into()))
        );
        assert_eq!(
            Params::parse(["bits=4", "bits=8"]),
            Err(PackError::DuplicateParam("bits".into()))
        );
        let p = Params::new().with("bits", "3");
        let e = p.resolve("t", SPEC).err().unwrap();
        assert!(e.to_string().contains("allowed: 4, 8"), "{e}");
        let p = Params::new().with("colour", "red");
        let e = p.resolve("t", SPEC).err().unwrap();
        assert!(e.to_string().contains("known: bits, symmetric"), "{e}");
    }
}
