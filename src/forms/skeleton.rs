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
use crate::onnx::Model;
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

/// The model's bytes with each top-level initializer that `edit` changes
/// (it says so) re-encoded; every other byte is the model's.
fn edit_initializers<E: From<Error>>(
    model: &Model,
    mut edit: impl FnMut(usize, &mut pb::TensorProto) -> std::result::Result<bool, E>,
) -> std::result::Result<Vec<u8>, E> {
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
            // Decoded over the model's bytes: raw data is not copied.
            let mut tensor: pb::TensorProto =
                crate::onnx::decode(bytes.slice(f.value_start..f.span.end), "TensorProto")?;
            index += 1;
            if edit(index - 1, &mut tensor)? {
                encoded_field(&mut graph, GRAPH_INITIALIZER, &tensor);
            } else {
                graph.extend_from_slice(&bytes[f.span.clone()]);
            }
        }
        put_len_prefix(&mut out, MODEL_GRAPH, graph.len() as u64);
        out.extend_from_slice(&graph);
    }
    Ok(out)
}

/// The model with the initializers of `moved` (by index in the graph,
/// each with the key of the entry that holds its raw bytes) as external
/// data naming those entries.
pub fn split(model: &Model, moved: &HashMap<usize, String>) -> Result<Vec<u8>> {
    edit_initializers(model, |i, t| {
        let Some(key) = moved.get(&i) else {
            return Ok(false);
        };
        let length = t.raw_data.len() as u64;
        t.raw_data = Bytes::new();
        t.data_location = EXTERNAL;
        t.external_data = external_data(&format!("{ENTRY_SCHEME}{key}"), length);
        Ok(true)
    })
}

/// The served model of a form's `skeleton`: each moved initializer's
/// location becomes what `locate` says for its entry key (the payload
/// file's name), and the moved initializers are listed. Any tensor held
/// as external data that names no entry is refused: a served form names
/// no file but the store's.
pub fn served<E: From<Error>>(
    skeleton: Bytes,
    mut locate: impl FnMut(&str) -> std::result::Result<String, E>,
) -> std::result::Result<(Vec<u8>, Vec<MovedTensor>), E> {
    let model = Model::from_bytes(skeleton, ".")?;
    super::model_digest::refuse_external_data_outside_initializers(&model)?;
    let mut moved = Vec::new();
    let out = edit_initializers::<E>(&model, |_, t| {
        let value = |k: &str| {
            t.external_data
                .iter()
                .find(|e| e.key == k)
                .map(|e| e.value.clone())
        };
        let location = value("location");
        let Some(key) = location
            .as_deref()
            .and_then(|l| l.strip_prefix(ENTRY_SCHEME).map(str::to_string))
        else {
            if t.data_location == EXTERNAL || location.is_some() {
                return Err(E::from(Error::Model(format!(
                    "initializer {:?} of a form names external data outside the store",
                    t.name
                ))));
            }
            return Ok(false);
        };
        let length = value("length")
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| {
                E::from(Error::Model(format!(
                    "moved initializer {:?} has no length",
                    t.name
                )))
            })?;
        t.external_data = external_data(&locate(&key)?, length);
        moved.push(MovedTensor {
            name: t.name.clone(),
            key,
            length,
            data_type: t.data_type,
            dims: t.dims.iter().map(|&d| d.max(0) as u64).collect(),
        });
        Ok(true)
    })?;
    Ok((out, moved))
}

/// The moved initializers a form's `skeleton` names, in order (checked as
/// [`served`] checks it).
pub fn moved(skeleton: Bytes) -> Result<Vec<MovedTensor>> {
    Ok(served::<Error>(skeleton, |_| Ok(String::new()))?.1)
}

/// The model with the initializers named in `data` holding those bytes as
/// raw data (no longer external): a materialized model made whole for a
/// runtime that reads no file.
pub fn inline(model: &Model, data: &HashMap<String, Bytes>) -> Result<Vec<u8>> {
    edit_initializers(model, |_, t| {
        let Some(bytes) = data.get(&t.name) else {
            return Ok(false);
        };
        t.raw_data = bytes.clone();
        t.data_location = 0;
        t.external_data.clear();
        Ok(true)
    })
}
