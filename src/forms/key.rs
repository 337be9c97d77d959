//! A runtime form's key (D15): the model's content, the runtime as it
//! reports itself, the execution provider and every option that changes
//! the result, and the host's exact device tier where the form is
//! hardware-specific. Equal keys are the only hit; a key that differs
//! names its first differing part.

use std::collections::BTreeMap;
use std::fmt;

/// A runtime as it reports itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RuntimeIdentity {
    /// `onnxruntime` or `openvino`.
    pub name: String,
    /// Its version string, e.g. `1.32.0`.
    pub version: String,
    /// Its build string (commit, build type), as its library and its
    /// Python module both report it.
    pub build: String,
}

/// What a form was made from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FormKey {
    /// The model's content digest ([`super::model_digest`]).
    pub model: [u8; 32],
    /// The runtime that made the form.
    pub runtime: RuntimeIdentity,
    /// The execution provider or device (`CPUExecutionProvider`, `CPU`).
    pub provider: String,
    /// The options that change the result (the optimization level, the
    /// provider's options), by name.
    pub options: BTreeMap<String, String>,
    /// The host's exact device tier, for a hardware-specific form.
    pub device: Option<String>,
}

/// The part of a key that differs, with both sides: this form's, then the
/// asked one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// Another model (by content).
    Model,
    /// Another runtime.
    Runtime(String, String),
    /// Another version of the runtime.
    Version(String, String),
    /// Another build of the same version.
    Build(String, String),
    /// Another execution provider or device.
    Provider(String, String),
    /// An option set otherwise (absent: `None`).
    Option(String, Option<String>, Option<String>),
    /// Another device tier.
    Device(Option<String>, Option<String>),
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
        match self {
            KeyPart::Model => f.write_str("another model content"),
            KeyPart::Runtime(a, b) => write!(f, "another runtime (the form's: {a}; asked: {b})"),
            KeyPart::Version(a, b) => {
                write!(f, "another runtime version (the form's: {a}; asked: {b})")
            }
            KeyPart::Build(a, b) => write!(
                f,
                "another build of the runtime (the form's: {a}; asked: {b})"
            ),
            KeyPart::Provider(a, b) => write!(f, "another provider (the form's: {a}; asked: {b})"),
            KeyPart::Option(k, a, b) => write!(
                f,
                "option {k} set otherwise (the form's: {}; asked: {})",
                or_none(a),
                or_none(b)
            ),
            KeyPart::Device(a, b) => write!(
                f,
                "another device tier (the form's: {}; asked: {})",
                or_none(a),
                or_none(b)
            ),
        }
    }
}

impl FormKey {
    /// The key's digest: its canonical encoding (every part length-prefixed,
    /// options by name) under blake3. The store files a form under it.
    pub fn digest(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(b"ctcache runtime-form key v1\0");
        h.update(&self.model);
        let mut part = |s: &str| {
            h.update(&(s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        };
        part(&self.runtime.name);
        part(&self.runtime.version);
        part(&self.runtime.build);
        part(&self.provider);
        part(&self.options.len().to_string());
        for (k, v) in &self.options {
            part(k);
            part(v);
        }
        part(self.device.as_deref().unwrap_or(""));
        part(if self.device.is_some() {
            "tier"
        } else {
            "portable"
        });
        *h.finalize().as_bytes()
    }

    /// The first part in which `asked` differs from this form's key, in
    /// the order a user acts on them; `None` when the keys are equal.
    pub fn difference(&self, asked: &FormKey) -> Option<KeyPart> {
        let (a, b) = (&self.runtime, &asked.runtime);
        if self.model != asked.model {
            return Some(KeyPart::Model);
        }
        if a.name != b.name {
            return Some(KeyPart::Runtime(a.name.clone(), b.name.clone()));
        }
        if a.version != b.version {
            return Some(KeyPart::Version(a.version.clone(), b.version.clone()));
        }
        if a.build != b.build {
            return Some(KeyPart::Build(a.build.clone(), b.build.clone()));
        }
        if self.provider != asked.provider {
            return Some(KeyPart::Provider(
                self.provider.clone(),
                asked.provider.clone(),
            ));
        }
        let names = self.options.keys().chain(asked.options.keys());
        for k in names {
            let (x, y) = (self.options.get(k), asked.options.get(k));
            if x != y {
                return Some(KeyPart::Option(k.clone(), x.cloned(), y.cloned()));
            }
        }
        if self.device != asked.device {
            return Some(KeyPart::Device(self.device.clone(), asked.device.clone()));
        }
        None
    }
}
