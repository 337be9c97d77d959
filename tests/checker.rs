//! The checker: one model per rule that violates it, and a valid model that
//! passes. Each case asserts the rule id reported.

mod common;

use bytes::Bytes;
use common::*;
use ctcache::check::{check_model, CheckOptions};
use ctcache::pb;
use ctcache::pb::struct_type_proto::{self as st, Kind};

type Mutation = fn(&mut pb::ModelProto);

fn value(m: &mut pb::ModelProto) -> &mut pb::StructProto {
    m.compiled_tensors[0].value.as_mut().unwrap()
}

fn field(name: &str, tp: pb::TypeProto) -> st::Field {
    st::Field {
        name: name.into(),
        content: Some(st::field::Content::Type(tp)),
        doc_string: String::new(),
    }
}

/// Replaces the model-level type with a static FLOAT[32] declaration of the given kind.
fn set_kind(m: &mut pb::ModelProto, kind: Kind) {
    m.struct_types[0].kind = Some(kind);
    m.struct_types[0].dims_param.clear();
    value(m).dims.clear();
}

fn cases() -> Vec<(&'static str, &'static str, Mutation)> {
    vec![
        ("duplicate device", "device.unique", |m| {
            m.devices.push(m.devices[0].clone())
        }),
        ("empty device type", "device.type", |m| {
            m.devices[0].r#type.clear()
        }),
        ("device index out of range", "device.index", |m| {
            m.compiled_tensors[0].device = 3
        }),
        ("negative device index", "device.index", |m| {
            m.compiled_tensors[0].device = -1
        }),
        ("duplicate cache key", "key.unique", |m| {
            let e = m.compiled_tensors[0].clone();
            m.compiled_tensors.push(e)
        }),
        ("missing source", "source.exists", |m| {
            m.compiled_tensors[0].source_name = "nope".into()
        }),
        ("ambiguous source", "source.unique", |m| {
            let g = m.graph.as_mut().unwrap();
            let t = g.initializer[0].clone();
            g.initializer.push(t)
        }),
        ("empty digest", "digest.present", |m| {
            m.compiled_tensors[0].source_digest = Bytes::new()
        }),
        ("empty algorithm", "digest.present", |m| {
            m.compiled_tensors[0].digest_algorithm.clear()
        }),
        ("no value", "value.present", |m| {
            m.compiled_tensors[0].value = None
        }),
        ("type index out of range", "struct.type_index", |m| {
            value(m).r#type = 7
        }),
        ("type index and inline type", "struct.type_index", |m| {
            value(m).struct_type = Some(copy_type())
        }),
        ("type -1 without inline", "struct.type_index", |m| {
            value(m).r#type = -1
        }),
        ("type -2", "struct.type_index", |m| value(m).r#type = -2),
        (
            "unconstrained inline value type",
            "struct.unconstrained",
            |m| {
                let v = value(m);
                v.r#type = -1;
                v.struct_type = Some(pb::StructTypeProto::default());
            },
        ),
        ("unconstrained nested type", "struct.unconstrained", |m| {
            let nested = pb::TypeProto {
                value: Some(pb::type_proto::Value::StructType(Box::default())),
                denotation: String::new(),
            };
            set_kind(
                m,
                Kind::Structure(st::Structure {
                    field: vec![field("a", nested)],
                }),
            )
        }),
        ("payload too short", "payload.size", |m| {
            let v = value(m);
            v.raw_data = v.raw_data.slice(..100)
        }),
        ("dims count mismatch", "struct.dims", |m| {
            value(m).dims.push(1)
        }),
        ("unnamed model-level type", "struct.name", |m| {
            m.struct_types[0].name.clear()
        }),
        ("duplicate type names", "struct.name", |m| {
            m.struct_types.push(copy_type())
        }),
        ("declaration that is a reference", "struct.kind", |m| {
            m.struct_types[0].kind = Some(Kind::TypeIndex(0))
        }),
        ("static form with a name", "struct.static_form", |m| {
            let mut inner = static_type(array(scalar(1), st::array::Count::Dimension(32)));
            if let Some(pb::type_proto::Value::StructType(s)) = inner.value.as_mut() {
                s.name = "x".into();
            }
            set_kind(
                m,
                Kind::Structure(st::Structure {
                    field: vec![field("a", inner)],
                }),
            )
        }),
        ("dangling reference", "struct.reference", |m| {
            set_kind(
                m,
                Kind::Structure(st::Structure {
                    field: vec![field("a", static_type(Kind::TypeIndex(9)))],
                }),
            )
        }),
        ("reference cycle", "struct.cycle", |m| {
            let mut b = copy_type();
            b.name = "b".into();
            b.dims_param.clear();
            b.kind = Some(Kind::Structure(st::Structure {
                field: vec![field("a", static_type(Kind::TypeIndex(2)))],
            }));
            let mut c = b.clone();
            c.name = "c".into();
            c.kind = Some(Kind::Structure(st::Structure {
                field: vec![field("a", static_type(Kind::TypeIndex(1)))],
            }));
            m.struct_types.push(b);
            m.struct_types.push(c);
        }),
        ("parameterized type nested", "struct.param_nesting", |m| {
            let mut outer = copy_type();
            outer.name = "outer".into();
            outer.dims_param.clear();
            outer.kind = Some(Kind::Structure(st::Structure {
                field: vec![field("a", static_type(Kind::TypeIndex(0)))],
            }));
            m.struct_types.push(outer);
        }),
        ("unused dims_param", "struct.dims_param", |m| {
            m.struct_types[0].dims_param.push("unused".into());
            value(m).dims.push(1);
        }),
        ("dims_index out of range", "struct.dims_param", |m| {
            m.struct_types[0].kind = Some(array(scalar(1), st::array::Count::DimsIndex(3)))
        }),
        ("array without count", "struct.count", |m| {
            m.struct_types[0].kind = Some(Kind::Array(Box::new(st::Array {
                element_type: Some(Box::new(scalar(1))),
                count: None,
            })))
        }),
        ("STRING leaf", "struct.leaf", |m| {
            m.struct_types[0].kind = Some(array(scalar(8), st::array::Count::DimsIndex(0)))
        }),
        ("UNDEFINED leaf", "struct.leaf", |m| {
            m.struct_types[0].kind = Some(array(scalar(0), st::array::Count::DimsIndex(0)))
        }),
        ("shaped leaf", "struct.leaf", |m| {
            let mut t = scalar(1);
            if let Some(pb::type_proto::Value::TensorType(tt)) = t.value.as_mut() {
                tt.shape = Some(pb::TensorShapeProto {
                    dim: vec![Default::default()],
                });
            }
            m.struct_types[0].kind = Some(array(t, st::array::Count::DimsIndex(0)))
        }),
        ("duplicate field names", "struct.field_name", |m| {
            set_kind(
                m,
                Kind::Structure(st::Structure {
                    field: vec![field("a", scalar(1)), field("a", scalar(1))],
                }),
            )
        }),
        ("field without content", "struct.field_content", |m| {
            set_kind(
                m,
                Kind::Structure(st::Structure {
                    field: vec![st::Field {
                        name: "a".into(),
                        content: None,
                        doc_string: String::new(),
                    }],
                }),
            )
        }),
        ("external constant", "struct.constant", |m| {
            let mut c = f32_tensor("c", &[1], &[1.0]);
            c.raw_data = Bytes::new();
            c.data_location = 1;
            c.external_data = vec![kv("location", "x.bin")];
            let f = st::Field {
                name: "c".into(),
                content: Some(st::field::Content::Constant(c)),
                doc_string: String::new(),
            };
            set_kind(
                m,
                Kind::Structure(st::Structure {
                    field: vec![
                        f,
                        field(
                            "w",
                            static_type(array(scalar(1), st::array::Count::Dimension(32))),
                        ),
                    ],
                }),
            )
        }),
        ("zero-width component", "struct.packed_component", |m| {
            set_kind(
                m,
                Kind::PackedArray(st::PackedArray {
                    component: vec![st::packed_array::Component {
                        name: "a".into(),
                        bit_width: 0,
                    }],
                    count: Some(st::packed_array::Count::Dimension(8)),
                }),
            )
        }),
        ("size overflow", "struct.size_overflow", |m| {
            set_kind(m, array(scalar(1), st::array::Count::Dimension(1 << 62)))
        }),
        ("not byte aligned", "struct.byte_aligned", |m| {
            set_kind(m, array(scalar(22), st::array::Count::Dimension(3)))
        }),
        ("nesting too deep", "struct.depth", |m| {
            let mut k = array(scalar(1), st::array::Count::Dimension(1));
            for _ in 0..20 {
                k = array(static_type(k), st::array::Count::Dimension(1));
            }
            set_kind(m, k)
        }),
        ("duplicate metadata key", "metadata.unique", |m| {
            m.compiled_tensors[0].metadata_props = vec![kv("a", "1"), kv("a", "2")]
        }),
        ("duplicate device metadata key", "metadata.unique", |m| {
            m.devices[0].metadata_props.push(kv("cpu.features", "x"))
        }),
        ("external payload without length", "payload.external", |m| {
            let v = value(m);
            v.raw_data = Bytes::new();
            v.external_data = vec![kv("location", "w.bin"), kv("offset", "0")];
        }),
        (
            "external payload escaping the folder",
            "payload.external",
            |m| {
                let v = value(m);
                v.raw_data = Bytes::new();
                v.external_data = vec![
                    kv("location", "../w.bin"),
                    kv("offset", "0"),
                    kv("length", "128"),
                ];
            },
        ),
        (
            "external payload and inline bytes",
            "payload.external",
            |m| {
                value(m).external_data = vec![kv("location", "w.bin"), kv("length", "128")];
            },
        ),
    ]
}

#[test]
fn valid_model_passes() {
    let errors = check_model(&open(&compiled_model()), &CheckOptions::default()).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn each_rule_is_enforced() {
    let mut failures = Vec::new();
    for (name, rule, mutate) in cases() {
        let mut m = compiled_model();
        mutate(&mut m);
        let errors = check_model(&open(&m), &CheckOptions::default()).unwrap();
        if !errors.iter().any(|e| e.rule == rule) {
            failures.push(format!("{name}: expected [{rule}], got {errors:?}"));
        }
        // Entry-level errors name the entry.
        for e in errors
            .iter()
            .filter(|e| e.rule.starts_with("source") || e.rule.starts_with("digest"))
        {
            assert_eq!(e.entry.as_ref().map(|r| r.index), Some(0), "{name}");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn model_limits_apply_before_decoding() {
    let mut m = compiled_model();
    for i in 0..5 {
        let mut d = cpu();
        d.architecture = format!("x{i}");
        m.devices.push(d);
    }
    let opts = CheckOptions {
        limits: ctcache::structs::Limits {
            max_entries: 3,
            ..Default::default()
        },
    };
    let errors = check_model(&open(&m), &opts).unwrap();
    assert!(
        errors.iter().any(|e| e.rule == "model.limits"),
        "{errors:?}"
    );
}

/// Each value's walk is bounded by `max_nodes`; `max_model_nodes` bounds
/// them together (a small model of many entries over one large type would
/// otherwise cost entries x nodes). Entries of the same type and dims walk
/// it once.
#[test]
fn the_walks_of_all_values_share_one_budget() {
    let in_all = |errors: &[ctcache::check::CheckError]| {
        errors
            .iter()
            .filter(|e| e.rule == "struct.limits" && e.message.contains("in all"))
            .count()
    };
    let opts = CheckOptions {
        limits: ctcache::structs::Limits {
            max_model_nodes: 10,
            ..Default::default()
        },
    };
    let mut m = compiled_model();
    let first = m.compiled_tensors[0].clone();
    // Same type and dims: one walk, whatever the number of entries.
    m.compiled_tensors = vec![first.clone(); 20];
    assert_eq!(in_all(&check_model(&open(&m), &opts).unwrap()), 0);
    // Other dims each: walks until the budget is spent, then refusals.
    m.compiled_tensors = (1..=20u64)
        .map(|k| {
            let mut e = first.clone();
            let v = e.value.as_mut().unwrap();
            v.dims = vec![k];
            v.raw_data = vec![0u8; 4 * k as usize].into();
            e
        })
        .collect();
    let refused = in_all(&check_model(&open(&m), &opts).unwrap());
    assert!((10..20).contains(&refused), "{refused} of 20 refused");
    assert_eq!(
        in_all(&check_model(&open(&m), &CheckOptions::default()).unwrap()),
        0
    );
}
