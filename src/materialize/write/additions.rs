//! What a materialize appends to the graph: initializers whose bytes are
//! ranges of the payload files, those files once each, and fresh names.

use super::fields::Field;
use super::names::Names;
use super::proto;
use super::weight::PackedWeight;
use crate::pb;

/// One initializer of an in-memory model whose bytes are a range of a
/// cached payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadTensor {
    /// The initializer's name in the model.
    pub name: String,
    /// The payload's [`PackedWeight::file_name`].
    pub file_name: String,
    /// The byte range in the payload.
    pub offset: u64,
    /// Its length in bytes.
    pub length: u64,
    /// `TensorProto.DataType`.
    pub data_type: i32,
    /// The tensor's dims.
    pub dims: Vec<u64>,
}

/// What the materialize adds to the graph: the initializers it appends
/// (external data in the payload files), those files, and fresh names.
pub(super) struct Additions<'a> {
    pub(super) names: Names,
    /// The data folder's name, which locations start with.
    pub(super) data_name: String,
    pub(super) initializers: Vec<pb::TensorProto>,
    /// Where each appended initializer's bytes lie in its payload.
    pub(super) tensors: Vec<PayloadTensor>,
    /// The payload files, once each (equal payloads share one name).
    pub(super) files: Vec<&'a PackedWeight>,
    /// Bytes of payload the appended initializers reference.
    pub(super) payload_bytes: u64,
}

impl<'a> Additions<'a> {
    /// Appends the initializer `name`: `field` of `w`'s payload file.
    pub(super) fn append(&mut self, name: &str, w: &'a PackedWeight, field: Field) {
        if !self.files.iter().any(|f| f.file_name == w.file_name) {
            self.files.push(w);
        }
        // In memory (no data folder) the file name is the location.
        let location = match self.data_name.as_str() {
            "" => w.file_name.clone(),
            folder => format!("{folder}/{}", w.file_name),
        };
        self.initializers.push(proto::external_tensor(
            name,
            field.data_type,
            &field.shape,
            &location,
            field.span,
        ));
        self.tensors.push(PayloadTensor {
            name: name.into(),
            file_name: w.file_name.clone(),
            offset: field.span.offset,
            length: field.span.len,
            data_type: field.data_type.code(),
            dims: field.shape.clone(),
        });
        self.payload_bytes += field.span.len;
    }

    /// Appends `field` of `w`'s payload file under a fresh name from
    /// `base`; returns the name.
    pub(super) fn append_fresh(
        &mut self,
        base: String,
        w: &'a PackedWeight,
        field: Field,
    ) -> String {
        let name = self.names.fresh(base);
        self.append(&name, w, field);
        name
    }
}
