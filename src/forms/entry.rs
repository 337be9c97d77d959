//! A form as a store entry: the model digest is its source, the device its
//! tier (or ISA family), and its physical type a byte array whose metadata
//! carries the rest of the key (runtime, version, build, provider,
//! options). Every part of a [`FormKey`] is thus part of the entry key,
//! and a stored entry gives its form key back to name what differs.

use std::collections::BTreeMap;

use super::{FormKey, RuntimeIdentity};
use crate::digest::{Algorithm, SourceDigest};
use crate::dtype::DataType;
use crate::hit::SourceShape;
use crate::pb;
use crate::pb::struct_type_proto::{self as st, array, Kind};
use crate::pb::type_proto::{Tensor, Value};
use crate::store::{Entry, EntryKey};
use crate::structs::{self, StructError, FORMAT_VERSION_KEY};

/// The format version of the forms' physical types (2: the type declares
/// its one dim, as the structured-type contract asks of a root).
pub const FORM_FORMAT_VERSION: u32 = 2;

const RUNTIME: &str = "ctcache.form.runtime";
const VERSION: &str = "ctcache.form.version";
const BUILD: &str = "ctcache.form.build";
const PROVIDER: &str = "ctcache.form.provider";
const OPTION: &str = "ctcache.form.option.";

/// The physical type name of `runtime`'s form, for the runtimes that
/// have one.
pub fn form_type_name(runtime: &str) -> Option<&'static str> {
    match runtime {
        "onnxruntime" => Some("onnxruntime.optimized_model"),
        "openvino" => Some("openvino.compiled_model"),
        _ => None,
    }
}

/// Whether `type_name` is a form's physical type.
pub fn is_form_type(type_name: &str) -> bool {
    ["onnxruntime", "openvino"]
        .iter()
        .any(|r| form_type_name(r) == Some(type_name))
}

fn prop(key: &str, value: &str) -> pb::StringStringEntryProto {
    pb::StringStringEntryProto {
        key: key.to_string(),
        value: value.to_string(),
    }
}

impl FormKey {
    /// The source of the form's entry: the model's digest.
    pub fn source(&self) -> SourceDigest {
        SourceDigest {
            algorithm: Algorithm::Blake3,
            bytes: self.model,
        }
    }

    /// The device of the form's entry: a CPU of the exact tier
    /// (`x86_64-avx2`) for a hardware-specific form, else of the host's
    /// ISA family.
    pub fn device_proto(&self) -> pb::DeviceProto {
        let family = crate::device::isa_family(std::env::consts::ARCH);
        pb::DeviceProto {
            r#type: "cpu".into(),
            architecture: self.device.clone().unwrap_or_else(|| family.to_string()),
            ..Default::default()
        }
    }

    /// The physical type of the form's entry: `dims[0]` bytes, the rest of
    /// the key in its metadata. `None` for a runtime without forms.
    pub fn physical_type(&self) -> Option<pb::StructTypeProto> {
        let name = form_type_name(&self.runtime.name)?;
        let byte = pb::TypeProto {
            denotation: String::new(),
            value: Some(Value::TensorType(Tensor {
                elem_type: DataType::UINT8.code(),
                shape: None,
            })),
        };
        let mut metadata_props = vec![
            prop(FORMAT_VERSION_KEY, &FORM_FORMAT_VERSION.to_string()),
            prop(RUNTIME, &self.runtime.name),
            prop(VERSION, &self.runtime.version),
            prop(BUILD, &self.runtime.build),
            prop(PROVIDER, &self.provider),
        ];
        for (k, v) in &self.options {
            metadata_props.push(prop(&format!("{OPTION}{k}"), v));
        }
        Some(pb::StructTypeProto {
            kind: Some(Kind::Array(Box::new(st::Array {
                element_type: Some(Box::new(byte)),
                count: Some(array::Count::DimsIndex(0)),
            }))),
            name: name.to_string(),
            dims_param: vec!["bytes".to_string()],
            metadata_props,
            ..Default::default()
        })
    }

    /// The key of the form's entry (`None` for a runtime without forms).
    pub fn entry_key(&self) -> Option<Result<EntryKey, StructError>> {
        let t = self.physical_type()?;
        Some(EntryKey::derive(self.source(), &self.device_proto(), &t))
    }

    /// What the form's entry records as its source's shape: the form is
    /// made of a whole model, no tensor.
    pub fn source_shape() -> SourceShape {
        SourceShape {
            data_type: DataType::UINT8,
            dims: Vec::new(),
        }
    }

    /// The form key a stored entry was filed under; `None` for an entry
    /// that is no form of this build's format version (or whose type
    /// cannot be read).
    pub fn of_entry(e: &Entry) -> Option<FormKey> {
        if !is_form_type(&e.type_name) || e.format_version != FORM_FORMAT_VERSION {
            return None;
        }
        let t = e.physical_type().ok()?;
        let get = |k: &str| structs::metadata(&t.metadata_props, k).map(str::to_string);
        let options: BTreeMap<String, String> = t
            .metadata_props
            .iter()
            .filter_map(|p| Some((p.key.strip_prefix(OPTION)?.to_string(), p.value.clone())))
            .collect();
        let family = crate::device::isa_family(&e.device.architecture);
        let device = (family != e.device.architecture).then(|| e.device.architecture.clone());
        Some(FormKey {
            model: e.key.source.bytes,
            runtime: RuntimeIdentity {
                name: get(RUNTIME)?,
                version: get(VERSION)?,
                build: get(BUILD)?,
            },
            provider: get(PROVIDER)?,
            options,
            device,
        })
    }
}
