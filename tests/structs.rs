//! docs/FORMAT.md's worked sizes of structured types, the leaf reader and the physical type key.

mod common;

use common::*;
use ctcache::pb;
use ctcache::pb::struct_type_proto::{self as st, Kind};
use ctcache::structs::{check_value, leaves, physical_type_key, LeafType, LeafView, Limits};

fn field(name: &str, tp: pb::TypeProto) -> st::Field {
    st::Field {
        name: name.into(),
        content: Some(st::field::Content::Type(tp)),
        doc_string: String::new(),
    }
}

fn root(kind: Kind) -> pb::StructTypeProto {
    pb::StructTypeProto {
        kind: Some(kind),
        ..Default::default()
    }
}

fn packed(widths: &[(&str, u32)], count: st::packed_array::Count) -> Kind {
    Kind::PackedArray(st::PackedArray {
        component: widths
            .iter()
            .map(|(n, w)| st::packed_array::Component {
                name: n.to_string(),
                bit_width: *w,
            })
            .collect(),
        count: Some(count),
    })
}

#[test]
fn worked_sizes() {
    let l = Limits::default();
    // 128 x INT4 = 64 bytes.
    let int4 = root(array(scalar(22), st::array::Count::Dimension(128)));
    assert_eq!(check_value(&int4, &[], &[], &l).unwrap().byte_len, 64);
    // ... plus a FLOAT scale and an INT64 zero point = 76 bytes.
    let block = root(Kind::Structure(st::Structure {
        field: vec![
            field(
                "codes",
                static_type(array(scalar(22), st::array::Count::Dimension(128))),
            ),
            field("scale", scalar(1)),
            field("zero_point", scalar(7)),
        ],
    }));
    assert_eq!(check_value(&block, &[], &[], &l).unwrap().byte_len, 76);
    // packed_array(4, [sign:1, exponent:3, mantissa:2]) = 3 bytes.
    let fp6 = root(packed(
        &[("sign", 1), ("exponent", 3), ("mantissa", 2)],
        st::packed_array::Count::Dimension(4),
    ));
    assert_eq!(check_value(&fp6, &[], &[], &l).unwrap().byte_len, 3);
    // Array(FLOAT6-as-4-components group, dims_index 0) with dims [250] = 750 bytes.
    let mut groups = root(array(
        static_type(fp6.kind.clone().unwrap()),
        st::array::Count::DimsIndex(0),
    ));
    groups.dims_param = vec!["groups".into()];
    assert_eq!(check_value(&groups, &[250], &[], &l).unwrap().byte_len, 750);
    // The same through a model-level reference.
    let table = vec![pb::StructTypeProto {
        name: "fp6x4".into(),
        ..fp6.clone()
    }];
    let mut by_ref = root(array(
        static_type(Kind::TypeIndex(0)),
        st::array::Count::DimsIndex(0),
    ));
    by_ref.dims_param = vec!["groups".into()];
    assert_eq!(
        check_value(&by_ref, &[250], &table, &l).unwrap().byte_len,
        750
    );
}

#[test]
fn leaf_reader_views() {
    // blocks[2] of { scale: FLOAT16, codes: UINT8[3] }, then a tail UINT4[4].
    let block = static_type(Kind::Structure(st::Structure {
        field: vec![
            field("scale", scalar(10)),
            field(
                "codes",
                static_type(array(scalar(2), st::array::Count::Dimension(3))),
            ),
        ],
    }));
    let t = root(Kind::Structure(st::Structure {
        field: vec![
            field(
                "blocks",
                static_type(array(block, st::array::Count::Dimension(2))),
            ),
            field(
                "tail",
                static_type(array(scalar(21), st::array::Count::Dimension(4))),
            ),
        ],
    }));
    let l = Limits::default();
    assert_eq!(check_value(&t, &[], &[], &l).unwrap().byte_len, 12);
    let payload = [0x00, 0x3c, 1, 2, 3, 0x00, 0x40, 4, 5, 6, 0x21, 0x03];
    let ls = leaves(&t, &[], &[], &l).unwrap();
    let names: Vec<&str> = ls.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(names, ["blocks.scale", "blocks.codes", "tail"]);
    assert_eq!(ls[0].shape, [2]);
    assert_eq!(ls[1].shape, [2, 3]);
    assert_eq!(
        ls[0].elem,
        LeafType::Tensor(ctcache::dtype::DataType::FLOAT16)
    );
    let scales = LeafView {
        leaf: &ls[0],
        payload: &payload,
    };
    assert_eq!(scales.to_raw().unwrap(), [0x00, 0x3c, 0x00, 0x40]);
    let codes = LeafView {
        leaf: &ls[1],
        payload: &payload,
    };
    assert_eq!(codes.to_raw().unwrap(), [1, 2, 3, 4, 5, 6]);
    assert_eq!(codes.bits_at(4).unwrap(), 5);
    assert!(codes.bits_at(6).is_err());
    let tail = LeafView {
        leaf: &ls[2],
        payload: &payload,
    };
    assert_eq!(tail.to_raw().unwrap(), [0x21, 0x03]);
    // A view over a too-short payload errors instead of reading past it.
    let short = LeafView {
        leaf: &ls[2],
        payload: &payload[..10],
    };
    assert!(short.to_raw().is_err());
}

#[test]
fn physical_type_key_ignores_doc_strings_and_reference_form() {
    let l = Limits::default();
    let a = copy_type();
    let mut b = copy_type();
    b.doc_string = "documentation only".into();
    assert_eq!(
        physical_type_key(&a, &[], &l).unwrap(),
        physical_type_key(&b, &[], &l).unwrap()
    );
    let mut c = copy_type();
    c.name = "test.copy.f32.v2".into();
    assert_ne!(
        physical_type_key(&a, &[], &l).unwrap(),
        physical_type_key(&c, &[], &l).unwrap()
    );
    // A nested reference hashes like the inlined kind.
    let leaf = array(scalar(1), st::array::Count::Dimension(4));
    let table = vec![pb::StructTypeProto {
        name: "f32x4".into(),
        kind: Some(leaf.clone()),
        ..Default::default()
    }];
    let by_ref = root(Kind::Structure(st::Structure {
        field: vec![field("w", static_type(Kind::TypeIndex(0)))],
    }));
    let inline = root(Kind::Structure(st::Structure {
        field: vec![field("w", static_type(leaf))],
    }));
    assert_eq!(
        physical_type_key(&by_ref, &table, &l).unwrap(),
        physical_type_key(&inline, &table, &l).unwrap()
    );
}

/// A few table types of many fields, each field referring to the next type,
/// expand into fields^levels nodes when inlined: the key refuses past
/// `max_nodes` instead of building the tree (here 1000^3 fields from a table
/// of 3,000 fields), and a type within the budget still gets its key.
#[test]
fn physical_type_key_bounds_the_expansion_of_shared_references() {
    let level = |next: i32| pb::StructTypeProto {
        name: format!("t{next}"),
        kind: Some(Kind::Structure(st::Structure {
            field: (0..1000)
                .map(|i| field(&format!("f{i}"), static_type(Kind::TypeIndex(next))))
                .collect(),
        })),
        ..Default::default()
    };
    let leaf = pb::StructTypeProto {
        name: "leaf".into(),
        kind: Some(Kind::Structure(st::Structure { field: vec![] })),
        ..Default::default()
    };
    let table = vec![level(1), level(2), level(3), leaf];
    let top = root(Kind::TypeIndex(0));
    let l = Limits::default();
    let started = std::time::Instant::now();
    let err = physical_type_key(&top, &table, &l).unwrap_err();
    assert_eq!(err.rule, "struct.limits", "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // One level below: a million nodes, still refused; the last level's
    // 1,000 fields are keyed.
    assert!(physical_type_key(&root(Kind::TypeIndex(1)), &table, &l).is_err());
    assert!(physical_type_key(&root(Kind::TypeIndex(2)), &table, &l).is_ok());
}
