//! The hit rule on hand-made entries: each miss reason, in order, and the
//! verdict cache.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::dtype::DataType;
use crate::pb::struct_type_proto::{self as st, Kind};
use crate::pb::type_proto::{Tensor, Value};
use crate::structs::{physical_type_key, FORMAT_VERSION_KEY, PACKER_KEY};

fn kv(k: &str, v: &str) -> pb::StringStringEntryProto {
    pb::StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    }
}

fn field(name: &str, elem: DataType) -> st::Field {
    st::Field {
        name: name.into(),
        content: Some(st::field::Content::Type(pb::TypeProto {
            value: Some(Value::TensorType(Tensor {
                elem_type: elem.code(),
                shape: None,
            })),
            denotation: String::new(),
        })),
        doc_string: String::new(),
    }
}

/// `t.pair`: a structure {a: FLOAT, b: INT32} (fields in the given order).
fn pair(fields: Vec<st::Field>) -> pb::StructTypeProto {
    pb::StructTypeProto {
        kind: Some(Kind::Structure(st::Structure { field: fields })),
        name: "t.pair".into(),
        metadata_props: vec![kv(FORMAT_VERSION_KEY, "1"), kv(PACKER_KEY, "t")],
        ..Default::default()
    }
}

fn good_type() -> pb::StructTypeProto {
    pair(vec![
        field("a", DataType::FLOAT),
        field("b", DataType::INT32),
    ])
}

fn shape() -> SourceShape {
    SourceShape {
        data_type: DataType::FLOAT,
        dims: vec![2, 3],
    }
}

fn layout() -> KnownLayout {
    KnownLayout {
        key: physical_type_key(&good_type(), &[], &Default::default()).unwrap(),
        type_name: "t.pair".into(),
        dims: vec![6],
        source: shape(),
        packer: "t".into(),
        params: String::new(),
        format_version: 1,
    }
}

/// Knows `t.pair` at version 1 for FLOAT sources; counts its calls.
#[derive(Default)]
struct Pairs(std::sync::Arc<AtomicUsize>);

impl TypeRegistry for Pairs {
    fn candidates(
        &self,
        claimed: &pb::StructTypeProto,
        source: &SourceShape,
    ) -> Result<Vec<KnownLayout>, MissReason> {
        self.0.fetch_add(1, Ordering::SeqCst);
        if crate::structs::metadata(&claimed.metadata_props, PACKER_KEY) != Some("t") {
            return Err(MissReason::UnknownPhysicalType {
                name: claimed.name.clone(),
                detail: "unknown packer".into(),
            });
        }
        if crate::structs::metadata(&claimed.metadata_props, FORMAT_VERSION_KEY) != Some("1") {
            return Err(MissReason::UnsupportedFormatVersion {
                name: claimed.name.clone(),
                version: "?".into(),
            });
        }
        Ok(if source.data_type == DataType::FLOAT {
            vec![KnownLayout {
                source: source.clone(),
                ..layout()
            }]
        } else {
            vec![]
        })
    }
}

struct Fake {
    device: pb::DeviceProto,
    ty: pb::StructTypeProto,
    dims: Vec<u64>,
    shape: Option<SourceShape>,
    uid: Option<u32>,
    checksum: Option<String>,
    payload: Bytes,
}

impl Fake {
    fn new() -> Fake {
        let payload = Bytes::from_static(b"payload");
        Fake {
            device: cpu(),
            ty: good_type(),
            dims: vec![6],
            shape: Some(shape()),
            uid: None,
            checksum: Some(payload_checksum(&payload)),
            payload,
        }
    }
}

impl EntryFacts for Fake {
    fn device(&self) -> Result<&pb::DeviceProto, MissReason> {
        Ok(&self.device)
    }
    fn type_key(&self) -> Result<PhysicalTypeKey, MissReason> {
        Ok(physical_type_key(&self.ty, &[], &Default::default()).unwrap())
    }
    fn physical_type(&self) -> Result<pb::StructTypeProto, MissReason> {
        Ok(self.ty.clone())
    }
    fn dims(&self) -> &[u64] {
        &self.dims
    }
    fn source_shape(&self) -> Option<&SourceShape> {
        self.shape.as_ref()
    }
    fn client_uid(&self) -> Option<u32> {
        self.uid
    }
    fn payload_checksum(&self) -> Option<&str> {
        self.checksum.as_deref()
    }
    fn payload(&self) -> Result<Bytes, MissReason> {
        Ok(self.payload.clone())
    }
}

fn cpu() -> pb::DeviceProto {
    pb::DeviceProto {
        r#type: "cpu".into(),
        architecture: "x86_64-avx2".into(),
        ..Default::default()
    }
}

fn host() -> Host {
    Host::new(
        vec![cpu()],
        None,
        Accept::Known(Arc::new(KnownTypes::new(Pairs::default()))),
    )
}

fn code(e: &Fake, h: &Host) -> &'static str {
    match judge(e, h) {
        Ok(_) => "hit",
        Err(m) => m.code(),
    }
}

#[test]
fn a_hit_carries_its_layout() {
    let u = judge(&Fake::new(), &host()).unwrap();
    assert_eq!(u.host_device, 0);
    assert_eq!(*u.layout.unwrap(), layout());
}

#[test]
fn each_miss_reason() {
    let h = host();
    let mut e = Fake::new();
    e.device.r#type = "wgpu".into();
    e.ty.name = "other".into(); // the device is checked first
    assert_eq!(code(&e, &h), "incompatible_device");

    // A known name over another layout: fields reordered, resized, renamed.
    for fields in [
        vec![field("b", DataType::INT32), field("a", DataType::FLOAT)],
        vec![field("a", DataType::FLOAT), field("b", DataType::INT64)],
        vec![field("a", DataType::FLOAT), field("c", DataType::INT32)],
    ] {
        let mut e = Fake::new();
        e.ty = pair(fields);
        assert_eq!(code(&e, &h), "unknown_physical_type");
    }
    let mut e = Fake::new();
    e.ty.metadata_props[1].value = "vendor".into();
    assert_eq!(code(&e, &h), "unknown_physical_type");
    let mut e = Fake::new();
    e.ty.metadata_props[0].value = "2".into();
    assert_eq!(code(&e, &h), "unsupported_format_version");

    let mut e = Fake::new();
    e.dims = vec![3, 2];
    assert_eq!(code(&e, &h), "unknown_physical_type");
    let mut e = Fake::new();
    e.shape = None;
    assert_eq!(code(&e, &h), "no_source_shape");
    let mut e = Fake::new();
    e.shape = Some(SourceShape {
        data_type: DataType::INT8,
        dims: vec![2, 3],
    });
    assert_eq!(code(&e, &h), "unknown_physical_type");

    let mut e = Fake::new();
    e.uid = Some(1000);
    assert_eq!(code(&e, &h), "hit");
    assert_eq!(
        code(&e, &h.clone().daemon_produced_only(true)),
        "not_daemon_produced"
    );

    let mut e = Fake::new();
    e.payload = Bytes::from_static(b"paylOad");
    assert_eq!(code(&e, &h), "payload_checksum");
    let mut e = Fake::new();
    e.checksum = Some(e.checksum.unwrap().to_uppercase());
    assert_eq!(code(&e, &h), "payload_checksum");
    let mut e = Fake::new();
    e.checksum = None;
    e.payload = Bytes::from_static(b"anything");
    assert_eq!(code(&e, &h), "hit", "no checksum recorded, none checked");
}

#[test]
fn exact_layouts_and_names() {
    let exact = Host::new(vec![cpu()], None, Accept::exact([layout()]));
    assert_eq!(code(&Fake::new(), &exact), "hit");
    let mut e = Fake::new();
    e.ty.name = "t.pair2".into();
    assert_eq!(code(&e, &exact), "unknown_physical_type");
    let mut other = layout();
    other.source.dims = vec![3, 2];
    let exact = Host::new(vec![cpu()], None, Accept::exact([other]));
    assert_eq!(code(&Fake::new(), &exact), "unknown_physical_type");

    let named = host().accepting_names([("t.pair".to_string(), vec![1])]);
    assert_eq!(code(&Fake::new(), &named), "hit");
    let named = host().accepting_names([("t.pair".to_string(), vec![2])]);
    assert_eq!(code(&Fake::new(), &named), "unknown_physical_type");
    let named = host().accepting_names([("x".to_string(), vec![])]);
    assert_eq!(code(&Fake::new(), &named), "unknown_physical_type");
    // Any judges no type: for listings only.
    let any = Host::new(vec![cpu()], None, Accept::Any);
    let mut e = Fake::new();
    e.ty.name = "whatever".into();
    e.shape = None;
    assert_eq!(code(&e, &any), "hit");
    assert_eq!(
        code(&Fake::new(), &Host::any_device(host().accept().clone())),
        "hit"
    );
}

#[test]
fn checksum_test_vector_of_docs_format() {
    let v = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85";
    assert_eq!(payload_checksum(b"abc"), v);
    assert!(check_payload(v, b"abc").is_ok());
    assert!(check_payload(v, b"abd").is_err());
}

#[test]
fn verdicts_are_cached_per_type_and_shape() {
    let calls = Arc::new(AtomicUsize::new(0));
    let h = Host::new(
        vec![cpu()],
        None,
        Accept::Known(Arc::new(KnownTypes::new(Pairs(calls.clone())))),
    );
    for _ in 0..5 {
        assert_eq!(code(&Fake::new(), &h), "hit");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let mut e = Fake::new();
    e.shape.as_mut().unwrap().dims = vec![6];
    for _ in 0..3 {
        assert_eq!(code(&e, &h), "hit");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
