//! A form's model with its large initializers moved out (D15): each is a
//! store entry of its own (equal tensors shared between forms and models),
//! and the model the form keeps names it by entry key. When the form is
//! served, each key becomes the name of that entry's payload file, so a
//! runtime maps the weights in place as for any model with external data.

use std::collections::HashMap;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::onnx::fields::{GRAPH_INITIALIZER, MODEL_GRAPH};
use crate::onnx::rewrite::encoded_field;
use crate::onnx::{Model, TensorRef};
use crate::pb;
use crate::wire::{put_len_prefix, Fields};

/// Where a moved initializer's location names its entry.
const ENTRY_SCHEME: &str = "ctcache-entry:";

/// `TensorProto.DataLocation.EXTERNAL`.
const EXTERNAL: i32 = 1;

/// A moved initializer, as the served model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedTensor {
    /// The initializer's name.
    pub name: String,
    /// The entry holding its bytes (`EntryKey` text).
    pub key: String,
    /// Its bytes (the whole payload).
    pub length: u64,
    /// `TensorProto.DataType`.
    pub data_type: i32,
    /// Its shape.
    pub dims: Vec<u64>,
}

fn external_data(location: &str, length: u64) -> Vec<pb::StringStringEntryProto> {
    let e = |k: &str, v: String| pb::StringStringEntryProto {
        key: k.into(),
        value: v,
    };
    vec![
        e("location", location.to_string()),
        e("offset", "0".into()),
        e("length", length.to_string()),
    ]
}

/// The model with the initializers of `moved` (by index in
/// `Model::initializers`' order, each with the key of the entry that holds
/// its bytes) as external data naming those entries; every other byte is
/// the model's.
pub fn split(
    model: &Model,
    initializers: &[TensorRef],
    moved: &HashMap<usize, String>,
) -> Result<Vec<u8>> {
    let bytes = model.bytes();
    let mut out = Vec::with_capacity(bytes.len().min(1 << 20));
    for top in model.top_fields() {
        if top.number != MODEL_GRAPH {
            out.extend_from_slice(&bytes[top.span.clone()]);
            continue;
        }
        let mut graph = Vec::new();
        let mut index = 0usize;
        for f in Fields::with_base(&bytes[top.value.clone()], top.value.start) {
            let f = f.map_err(|e| Error::wire("GraphProto", e))?;
            if f.number != GRAPH_INITIALIZER {
                graph.extend_from_slice(&bytes[f.span.clone()]);
                continue;
            }
            let i = index;
            index += 1;
            let Some(key) = moved.get(&i) else {
                graph.extend_from_slice(&bytes[f.span.clone()]);
                continue;
            };
            let t = initializers.get(i).ok_or_else(|| {
                Error::Model("the graph's initializers changed while read".into())
            })?;
            let length = t.raw_size().ok_or_else(|| {
                Error::Model(format!("initializer {:?} has no byte size", t.name))
            })?;
            let mut tensor: pb::TensorProto =
                crate::onnx::decode(bytes.slice(f.value_start..f.span.end), "TensorProto")?;
            tensor.raw_data = Bytes::new();
            tensor.data_location = EXTERNAL;
            tensor.external_data = external_data(&format!("{ENTRY_SCHEME}{key}"), length);
            encoded_field(&mut graph, GRAPH_INITIALIZER, &tensor);
        }
        put_len_prefix(&mut out, MODEL_GRAPH, graph.len() as u64);
        out.extend_from_slice(&graph);
    }
    Ok(out)
}

/// The served model of a form's `skeleton`: each moved initializer's
/// location becomes what `locate` says for its entry key (the payload
/// file's name), and the moved initializers are listed.
pub fn served<E: From<Error>>(
    skeleton: Bytes,
    mut locate: impl FnMut(&str) -> std::result::Result<String, E>,
) -> std::result::Result<(Vec<u8>, Vec<MovedTensor>), E> {
    let model = Model::from_bytes(skeleton, ".")?;
    let bytes = model.bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut moved = Vec::new();
    for top in model.top_fields() {
        if top.number != MODEL_GRAPH {
            out.extend_from_slice(&bytes[top.span.clone()]);
            continue;
        }
        let mut graph = Vec::new();
        for f in Fields::with_base(&bytes[top.value.clone()], top.value.start) {
            let f = f.map_err(|e| Error::wire("GraphProto", e))?;
            if f.number != GRAPH_INITIALIZER {
                graph.extend_from_slice(&bytes[f.span.clone()]);
                continue;
            }
            let mut tensor: pb::TensorProto =
                crate::onnx::decode(bytes.slice(f.value_start..f.span.end), "TensorProto")?;
            let location = tensor
                .external_data
                .iter()
                .find(|e| e.key == "location")
                .and_then(|e| e.value.strip_prefix(ENTRY_SCHEME))
                .map(str::to_string);
            let Some(key) = location else {
                graph.extend_from_slice(&bytes[f.span.clone()]);
                continue;
            };
            let length = tensor
                .external_data
                .iter()
                .find(|e| e.key == "length")
                .and_then(|e| e.value.parse::<u64>().ok())
                .ok_or_else(|| {
                    Error::Model(format!("moved initializer {:?} has no length", tensor.name))
                })?;
            tensor.external_data = external_data(&locate(&key)?, length);
            encoded_field(&mut graph, GRAPH_INITIALIZER, &tensor);
            moved.push(MovedTensor {
                name: tensor.name.clone(),
                key,
                length,
                data_type: tensor.data_type,
                dims: tensor.dims.iter().map(|&d| d.max(0) as u64).collect(),
            });
        }
        put_len_prefix(&mut out, MODEL_GRAPH, graph.len() as u64);
        out.extend_from_slice(&graph);
    }
    Ok((out, moved))
}
