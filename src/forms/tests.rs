use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message;

use super::*;
use crate::onnx::Model;
use crate::pb;

/// A change to a `T`, named beside it.
type Edit<T> = fn(&mut T);

fn key() -> FormKey {
    FormKey {
        model: [7; 32],
        runtime: RuntimeIdentity {
            name: "onnxruntime".into(),
            version: "1.32.0".into(),
            build: "git-commit-id=fab30a4, build type=Release".into(),
        },
        provider: "CPUExecutionProvider".into(),
        options: BTreeMap::from([("level".to_string(), "all".to_string())]),
        device: Some("x86_64-avx512".into()),
    }
}

#[test]
fn each_part_of_the_key_is_a_miss_that_names_it() {
    let form = key();
    assert_eq!(form.difference(&key()), None);
    assert_eq!(form.digest(), key().digest());
    let changes: Vec<(Edit<FormKey>, &str)> = vec![
        (|k| k.model[0] ^= 1, "another model content"),
        (|k| k.runtime.name = "openvino".into(), "another runtime"),
        (
            |k| k.runtime.version = "1.31.0".into(),
            "another runtime version",
        ),
        (
            |k| k.runtime.build = "git-commit-id=0000000".into(),
            "another build of the runtime",
        ),
        (
            |k| k.provider = "CUDAExecutionProvider".into(),
            "another provider",
        ),
        (
            |k| {
                k.options.insert("level".into(), "extended".into());
            },
            "option level set otherwise (the form's: all; asked: extended)",
        ),
        (
            |k| {
                k.options.insert("intra_op_num_threads".into(), "1".into());
            },
            "option intra_op_num_threads set otherwise (the form's: none; asked: 1)",
        ),
        (
            |k| k.device = Some("x86_64-avx2".into()),
            "another device tier",
        ),
        (
            |k| k.device = None,
            "another device tier (the form's: x86_64-avx512; asked: none)",
        ),
    ];
    for (change, named) in changes {
        let mut asked = key();
        change(&mut asked);
        let part = form.difference(&asked).expect("a difference");
        assert!(part.to_string().starts_with(named), "{part} for {named}");
        assert_ne!(form.digest(), asked.digest(), "{named}");
    }
}

/// A model with a top-level weight, a Constant node's tensor and an If
/// whose branch holds its own initializer.
fn model_proto() -> pb::ModelProto {
    let f32s = |name: &str, v: &[f32]| pb::TensorProto {
        name: name.into(),
        data_type: 1,
        dims: vec![v.len() as i64],
        raw_data: v
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<_>>()
            .into(),
        ..Default::default()
    };
    let node = |op: &str, inputs: &[&str], output: &str| pb::NodeProto {
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    };
    let mut constant = node("Constant", &[], "c");
    constant.attribute = vec![pb::AttributeProto {
        name: "value".into(),
        t: Some(f32s("", &[1.0, 2.0])),
        r#type: 4,
        ..Default::default()
    }];
    let branch = pb::GraphProto {
        name: "then".into(),
        node: vec![node("Identity", &["s"], "t")],
        initializer: vec![f32s("s", &[3.0, 4.0])],
        output: vec![pb::ValueInfoProto {
            name: "t".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut branch_node = node("If", &["cond"], "y");
    branch_node.attribute = ["then_branch", "else_branch"]
        .map(|name| pb::AttributeProto {
            name: name.into(),
            g: Some(branch.clone()),
            r#type: 5,
            ..Default::default()
        })
        .to_vec();
    let graph = pb::GraphProto {
        name: "g".into(),
        node: vec![constant, node("Add", &["x", "W"], "z"), branch_node],
        initializer: vec![f32s("W", &[5.0, 6.0])],
        ..Default::default()
    };
    pb::ModelProto::decode(Model::of_graph(graph, 17).bytes().clone()).unwrap()
}

fn digest_of(m: &pb::ModelProto, dir: &str) -> crate::Result<[u8; 32]> {
    model_digest(&Model::from_bytes(Bytes::from(m.encode_to_vec()), dir).unwrap())
}

#[test]
fn the_model_digest_is_its_content_wherever_it_lies() {
    let m = model_proto();
    let base = digest_of(&m, "/a").unwrap();
    assert_eq!(digest_of(&m, "/elsewhere").unwrap(), base, "moved");

    // The same weight held as float_data instead of raw_data: D3 is the same.
    let mut typed = m.clone();
    let w = &mut typed.graph.as_mut().unwrap().initializer[0];
    w.float_data = vec![5.0, 6.0];
    w.raw_data = Bytes::new();
    assert_eq!(
        digest_of(&typed, "/a").unwrap(),
        base,
        "another encoding of one content"
    );

    let edits: Vec<(Edit<pb::GraphProto>, &str)> = vec![
        (
            |g| g.initializer[0].raw_data = 7f32.to_le_bytes().repeat(2).into(),
            "a top-level weight",
        ),
        (
            |g| g.node[0].attribute[0].t.as_mut().unwrap().raw_data = vec![0; 8].into(),
            "a Constant's tensor",
        ),
        (
            |g| {
                g.node[2].attribute[0].g.as_mut().unwrap().initializer[0].raw_data =
                    vec![1; 8].into()
            },
            "a subgraph's weight",
        ),
        (|g| g.node[1].op_type = "Sub".into(), "a node"),
        (|g| g.initializer[0].name = "V".into(), "a weight's name"),
    ];
    for (edit, what) in edits {
        let mut changed = m.clone();
        edit(changed.graph.as_mut().unwrap());
        assert_ne!(digest_of(&changed, "/a").unwrap(), base, "{what}");
    }
}

#[test]
fn a_subgraph_weight_held_outside_the_model_is_refused() {
    let mut m = model_proto();
    let s = &mut m.graph.as_mut().unwrap().node[2].attribute[0]
        .g
        .as_mut()
        .unwrap()
        .initializer[0];
    s.raw_data = Bytes::new();
    s.data_location = 1;
    s.external_data = vec![pb::StringStringEntryProto {
        key: "location".into(),
        value: "w.bin".into(),
    }];
    let err = digest_of(&m, "/a").unwrap_err().to_string();
    assert!(err.contains("\"s\" is external data"), "{err}");
}

#[test]
fn a_graph_field_moved_to_the_top_level_is_another_model() {
    // The graph's last field (an output) and the same bytes as a field of
    // the model after the graph: the graph's end is part of the digest.
    let mut m = model_proto();
    // Nothing after the graph but what the test puts there.
    m.opset_import.clear();
    let g = m.graph.as_mut().unwrap();
    g.output = vec![pb::ValueInfoProto {
        name: "z".into(),
        ..Default::default()
    }];
    let inside = m.encode_to_vec();
    let mut outside_model = m.clone();
    let out = outside_model.graph.as_mut().unwrap().output.remove(0);
    let mut outside = outside_model.encode_to_vec();
    // GraphProto.output is field 12; as a ModelProto field 12 it is unknown.
    prost::encoding::message::encode(12, &out, &mut outside);
    let digest =
        |b: Vec<u8>| model_digest(&Model::from_bytes(Bytes::from(b), "/a").unwrap()).unwrap();
    assert_ne!(digest(inside), digest(outside));
}

#[test]
fn a_constant_held_outside_the_model_is_refused() {
    let mut m = model_proto();
    let t = m.graph.as_mut().unwrap().node[0].attribute[0]
        .t
        .as_mut()
        .unwrap();
    t.raw_data = Bytes::new();
    t.data_location = 1;
    t.external_data = vec![pb::StringStringEntryProto {
        key: "location".into(),
        value: "c.bin".into(),
    }];
    let err = digest_of(&m, "/a").unwrap_err().to_string();
    assert!(err.contains("is external data"), "{err}");
}

/// A form stored as an entry: each part of its key is part of the entry
/// key, and the entry gives the form key back.
#[test]
fn a_form_entry_keeps_its_whole_key() {
    use crate::store::{NewEntry, Producer, Store, StoreOptions};
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path(), StoreOptions::default()).unwrap();
    let put = |k: &FormKey| {
        let new = NewEntry {
            source: k.source(),
            source_shape: FormKey::source_shape(),
            device: k.device_proto(),
            physical_type: k.physical_type().unwrap(),
            dims: vec![5],
            producer: Producer::default(),
            source_names: vec![],
            model_paths: vec!["/m/a.onnx".into()],
            pack_duration: std::time::Duration::ZERO,
        };
        store.put(&new, &b"model"[..]).unwrap().entry
    };
    let form = key();
    let e = put(&form);
    assert_eq!(e.key, form.entry_key().unwrap().unwrap());
    assert_eq!(FormKey::of_entry(&e), Some(form.clone()));
    assert_eq!(e.type_name, "onnxruntime.optimized_model");
    let mut portable = key();
    portable.device = None;
    let p = put(&portable);
    assert_eq!(FormKey::of_entry(&p), Some(portable.clone()));
    let changes: Vec<Edit<FormKey>> = vec![
        |k| k.model[1] ^= 1,
        |k| k.runtime.version = "1.31.0".into(),
        |k| k.runtime.build.push('x'),
        |k| k.provider = "CUDAExecutionProvider".into(),
        |k| {
            k.options.insert("level".into(), "extended".into());
        },
        |k| k.device = Some("x86_64-avx2".into()),
    ];
    for change in changes {
        let mut other = key();
        change(&mut other);
        assert_ne!(other.entry_key().unwrap().unwrap(), e.key, "{other:?}");
    }
    assert_ne!(p.key, e.key);
    let mut unknown = key();
    unknown.runtime.name = "tensorrt".into();
    assert!(unknown.entry_key().is_none());
}

/// A moved initializer names its entry in the form's model, and the file
/// of that entry when served; every other initializer stays as it was.
#[test]
fn a_moved_initializer_names_its_entry_then_its_file() {
    let mut m = model_proto();
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(pb::TensorProto {
        name: "small".into(),
        data_type: 1,
        dims: vec![1],
        raw_data: vec![0u8; 4].into(),
        ..Default::default()
    });
    let model = Model::from_bytes(Bytes::from(m.encode_to_vec()), ".").unwrap();
    let moved = std::collections::HashMap::from([(0usize, "K0".to_string())]);
    let skeleton = split(&model, &moved).unwrap();
    let s = pb::ModelProto::decode(&skeleton[..]).unwrap();
    let w = &s.graph.as_ref().unwrap().initializer[0];
    assert!(w.raw_data.is_empty() && w.data_location == 1);
    assert_eq!(w.external_data[0].value, "ctcache-entry:K0");
    assert_eq!(w.external_data[2].value, "8");
    assert_eq!(s.graph.as_ref().unwrap().initializer[1], g_init(&m, 1));
    let (answer, list) =
        served::<crate::Error>(Bytes::from(skeleton), |k| Ok(format!("file-of-{k}"))).unwrap();
    let s = pb::ModelProto::decode(&answer[..]).unwrap();
    let w = &s.graph.as_ref().unwrap().initializer[0];
    assert_eq!(w.external_data[0].value, "file-of-K0");
    assert_eq!(
        list,
        vec![MovedTensor {
            name: "W".into(),
            key: "K0".into(),
            length: 8,
            data_type: 1,
            dims: vec![2],
        }]
    );
    // Everything else as it was: the graph's nodes, the model's fields.
    let mut back = s.clone();
    back.graph.as_mut().unwrap().initializer[0] = g_init(&m, 0);
    assert_eq!(back, m);
    let missing = served::<crate::Error>(Bytes::from(split(&model, &moved).unwrap()), |_| {
        Err(crate::Error::Model("gone".into()))
    });
    assert!(missing.is_err());
}

fn g_init(m: &pb::ModelProto, i: usize) -> pb::TensorProto {
    m.graph.as_ref().unwrap().initializer[i].clone()
}

/// A form whose model names a file (a fetched one, signed by a host that
/// holds a key) is refused when served, not handed to a runtime that
/// would read that file.
#[test]
fn a_form_naming_a_file_outside_the_store_is_refused() {
    let mut m = model_proto();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    w.raw_data = Bytes::new();
    w.data_location = 1;
    w.external_data = vec![pb::StringStringEntryProto {
        key: "location".into(),
        value: "/etc/shadow".into(),
    }];
    let e = served::<crate::Error>(Bytes::from(m.encode_to_vec()), |k| Ok(k.to_string()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside the store"), "{e}");
    // Nor anywhere else a runtime would read it: a node's attribute of the
    // graph or of a model-local function.
    let external = pb::TensorProto {
        name: "c".into(),
        data_type: 1,
        dims: vec![1],
        data_location: 1,
        external_data: vec![pb::StringStringEntryProto {
            key: "location".into(),
            value: "../../etc/shadow".into(),
        }],
        ..Default::default()
    };
    let constant = pb::NodeProto {
        op_type: "Constant".into(),
        output: vec!["c".into()],
        attribute: vec![pb::AttributeProto {
            name: "value".into(),
            r#type: 4,
            t: Some(external),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut in_graph = model_proto();
    in_graph.graph.as_mut().unwrap().node.push(constant.clone());
    let mut in_function = model_proto();
    in_function.functions.push(pb::FunctionProto {
        name: "f".into(),
        domain: "local".into(),
        node: vec![constant],
        ..Default::default()
    });
    for m in [in_graph, in_function] {
        let e = served::<crate::Error>(Bytes::from(m.encode_to_vec()), |k| Ok(k.to_string()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is external data"), "{e}");
        let model = Model::from_bytes(Bytes::from(m.encode_to_vec()), ".").unwrap();
        assert!(
            model_digest(&model).is_err(),
            "a form's key counts no file by its name"
        );
    }
}

/// A form's physical type is a valid root of the structured-type
/// contract: its one dim is its length in bytes (a reader of the fleet
/// tier checks every record's type against its dims).
#[test]
fn a_forms_type_sizes_its_payload_by_its_one_dim() {
    for runtime in ["onnxruntime", "openvino"] {
        let mut k = key();
        k.runtime.name = runtime.into();
        let t = k.physical_type().unwrap();
        let layout = crate::structs::check_value(&t, &[118_406], &[], &Default::default()).unwrap();
        assert_eq!(layout.byte_len, 118_406, "{runtime}");
        assert!(crate::structs::check_value(&t, &[], &[], &Default::default()).is_err());
    }
}
