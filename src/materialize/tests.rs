//! Plan rules and refusals. The full write (real packer payloads, byte
//! identity with onnxruntime) is tested in kernels/tests/materialize.rs and
//! tests/python/test_materialize.py.

use std::collections::HashMap;

use bytes::Bytes;
use prost::Message;

use super::*;
use crate::cancel::Cancel;
use crate::onnx::Model;
use crate::pb;

fn tensor(name: &str, data_type: i32, dims: &[i64]) -> pb::TensorProto {
    let elems: i64 = dims.iter().product();
    let width = match data_type {
        10 | 16 => 2,
        7 | 11 | 13 => 8,
        _ => 4,
    };
    pb::TensorProto {
        name: name.into(),
        data_type,
        dims: dims.to_vec(),
        raw_data: vec![0u8; (elems * width) as usize].into(),
        ..Default::default()
    }
}

// Not ctcache_testkit::node: this crate's unit tests see their own copy of
// the pb types, not the one the testkit links.
fn node(op: &str, name: &str, inputs: &[&str], output: &str) -> pb::NodeProto {
    pb::NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

fn attr_i(name: &str, i: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        i,
        r#type: 2,
        ..Default::default()
    }
}

fn attr_f(name: &str, f: f32) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        f,
        r#type: 1,
        ..Default::default()
    }
}

/// Untyped value infos, for graph inputs and outputs.
fn values(names: &[&str]) -> Vec<pb::ValueInfoProto> {
    names
        .iter()
        .map(|n| pb::ValueInfoProto {
            name: n.to_string(),
            ..Default::default()
        })
        .collect()
}

fn model(nodes: Vec<pb::NodeProto>, inits: Vec<pb::TensorProto>, inputs: &[&str]) -> Model {
    let graph = pb::GraphProto {
        name: "g".into(),
        node: nodes,
        initializer: inits,
        input: values(inputs),
        ..Default::default()
    };
    Model::of_graph(graph, 17)
}

#[test]
fn matmul_with_constant_2d_weight_is_a_target() {
    let m = model(
        vec![node("MatMul", "mm", &["x", "W"], "y")],
        vec![tensor("W", 1, &[64, 16])],
        &["x"],
    );
    let p = plan(&m).unwrap();
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    let t = &p.targets[0];
    assert_eq!(
        (t.k, t.n, t.transposed, t.op.clone()),
        (64, 16, false, Op::MatMul)
    );
    assert_eq!(p.weights(), vec![("W".to_string(), false)]);
}

#[test]
fn gemm_trans_b_reads_the_weight_as_n_by_k() {
    let mut g = node("Gemm", "fc", &["x", "W", "C"], "y");
    g.attribute = vec![
        attr_i("transB", 1),
        attr_f("alpha", 1.0),
        attr_f("beta", 1.0),
    ];
    let m = model(
        vec![g],
        vec![tensor("W", 1, &[16, 64]), tensor("C", 1, &[16])],
        &["x"],
    );
    let p = plan(&m).unwrap();
    let t = &p.targets[0];
    assert_eq!((t.k, t.n, t.transposed), (64, 16, true));
    assert_eq!(
        t.op,
        Op::Gemm {
            bias: Some("C".into())
        }
    );
}

#[test]
fn skip_rules_name_their_reason() {
    let mut alpha = node("Gemm", "alpha", &["x", "W"], "y1");
    alpha.attribute = vec![attr_f("alpha", 0.5)];
    let mut trans_a = node("Gemm", "transA", &["x", "W"], "y2");
    trans_a.attribute = vec![attr_i("transA", 1)];
    let mut beta = node("Gemm", "beta", &["x", "W", "C"], "y3");
    beta.attribute = vec![attr_f("beta", 2.0)];
    let m = model(
        vec![
            node("MatMul", "dynamic", &["x", "x2"], "a"),
            node("MatMul", "double", &["x", "D"], "b"),
            node("MatMul", "rank3", &["x", "R"], "c"),
            node("MatMul", "overridable", &["x", "I"], "d"),
            node("MatMul", "bf16", &["x", "H"], "e"),
            alpha,
            trans_a,
            beta,
        ],
        vec![
            tensor("D", 11, &[4, 4]),
            tensor("R", 1, &[1, 4, 4]),
            tensor("I", 1, &[4, 4]),
            tensor("H", 16, &[4, 4]),
            tensor("W", 1, &[4, 4]),
            tensor("C", 1, &[4]),
        ],
        &["x", "x2", "I"],
    );
    let p = plan(&m).unwrap();
    assert!(p.targets.is_empty());
    let reason = |n: &str| {
        let s = p.skipped.iter().find(|s| s.node == n).unwrap();
        format!("{}: {}", s.reason, s.detail)
    };
    assert!(reason("dynamic").contains("is a graph input (fed by the caller)"));
    assert!(reason("double").contains("DOUBLE"));
    assert!(reason("rank3").contains("2-D"));
    assert!(reason("overridable").contains("graph input"));
    assert!(reason("bf16").contains("BFLOAT16"));
    assert!(reason("alpha").contains("alpha"));
    assert!(reason("transA").contains("transA"));
    assert!(reason("beta").contains("beta"));
    // Reasons are the rule's words, details the node's case: reports count
    // nodes per reason.
    let groups = group_skips(
        p.skipped
            .iter()
            .map(|s| (s.op_type.as_str(), s.reason.as_str())),
    );
    assert_eq!(groups.len(), 7, "DOUBLE and BFLOAT16 share a reason");
    assert_eq!(
        groups[0].to_string(),
        "1 MatMul left as they are: B is a graph input, not a weight"
    );
    let twice = group_skips([
        ("MatMul", "B is computed, not a weight"),
        ("Gemm", "B is computed, not a weight"),
        ("MatMul", "B is computed, not a weight"),
    ]);
    assert_eq!(
        twice.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "2 MatMul left as they are: B is computed, not a weight",
            "1 Gemm left as they are: B is computed, not a weight"
        ]
    );
    let why = plan(&m).unwrap().why_nothing().unwrap();
    assert!(
        why.starts_with(
            "1 MatMul left as they are: B is a graph input, not a weight (MatMul dynamic: input B \"x2\""
        ) && why.contains(
            "; 2 MatMul left as they are: B is not FLOAT or FLOAT16 (first: MatMul double: "
        ) && why.matches(" left as they are: ").count() == 7,
        "{why}"
    );
}

#[test]
fn fp16_weights_are_targets() {
    let m = model(
        vec![node("MatMul", "mm", &["x", "W"], "y")],
        vec![tensor("W", 10, &[32, 8])],
        &["x"],
    );
    assert_eq!(
        plan(&m).unwrap().targets[0].data_type,
        crate::dtype::DataType::FLOAT16
    );
}

#[test]
fn skip_reasons_tell_constant_nodes_from_computed_inputs_and_name_the_int8_target() {
    let m = model(
        vec![
            node("Constant", "k", &[], "kw"),
            node("MatMul", "mm", &["x", "kw"], "y"),
            node("MatMul", "att", &["x", "y"], "s"),
            node("Conv", "c", &["x", "W"], "z"),
        ],
        vec![tensor("W", 1, &[4, 4, 1, 1])],
        &["x"],
    );
    let p = plan(&m).unwrap();
    let reasons: Vec<&str> = p.skipped.iter().map(|s| s.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "B is a Constant node, not an initializer",
            "B is computed, not a weight"
        ]
    );
    let why = p.why_nothing().unwrap();
    assert!(
        why.ends_with("; --target onnxruntime-int8 --op-types Conv quantizes its 1 Conv"),
        "{why}"
    );
}

#[test]
fn nothing_to_materialize_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.onnx");
    let refusal = |m: &Model| {
        let p = plan(m).unwrap();
        let s = Settings::default();
        let output = crate::outdir::OutFile::open(&out).unwrap();
        write(
            m,
            &p,
            s,
            &HashMap::new(),
            &output,
            LinkMode::default(),
            &Cancel::new(),
        )
        .unwrap_err()
        .to_string()
    };
    let none = model(vec![node("Relu", "r", &["x"], "y")], vec![], &["x"]);
    let e = refusal(&none);
    assert!(
        e.contains("no node of the op types rewritten (MatMul, Gemm)"),
        "{e}"
    );
    let dynamic = model(
        vec![node("MatMul", "mm", &["x", "x2"], "y")],
        vec![],
        &["x", "x2"],
    );
    let e = refusal(&dynamic);
    assert!(
        e.contains("1 MatMul left as they are: B is a graph input, not a weight"),
        "{e}"
    );
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn settings_are_validated() {
    let bad = [
        Settings {
            bits: 3,
            ..Default::default()
        },
        Settings {
            block_size: 48,
            ..Default::default()
        },
        Settings {
            accuracy_level: 7,
            ..Default::default()
        },
    ];
    for s in bad {
        assert!(s.validate().is_err(), "{s:?}");
    }
    Settings::default().validate().unwrap();
}

fn branch(name: &str, nodes: Vec<pb::NodeProto>, inputs: &[&str]) -> pb::GraphProto {
    pb::GraphProto {
        name: name.into(),
        node: nodes,
        input: values(inputs),
        output: values(&["out"]),
        ..Default::default()
    }
}

fn graph_attr(name: &str, g: pb::GraphProto) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        g: Some(g),
        r#type: 5,
        ..Default::default()
    }
}

#[test]
fn subgraph_nodes_reading_a_top_level_weight_are_targets() {
    let mut if_node = node("If", "branch", &["cond"], "y");
    if_node.attribute = vec![
        graph_attr(
            "then_branch",
            branch(
                "then",
                vec![node("MatMul", "t_mm", &["x", "W"], "out")],
                &[],
            ),
        ),
        graph_attr(
            "else_branch",
            // The body's own input named W shadows the top-level weight.
            branch(
                "else",
                vec![node("MatMul", "e_mm", &["x", "W"], "out")],
                &["W"],
            ),
        ),
    ];
    let m = model(
        vec![if_node],
        vec![tensor("W", 1, &[32, 8])],
        &["x", "cond"],
    );
    let p = plan(&m).unwrap();
    assert_eq!(p.targets.len(), 1, "{:?}", p.skipped);
    let t = &p.targets[0];
    assert_eq!(t.node.name, "t_mm");
    assert_eq!(
        t.scope,
        [Step {
            node: 0,
            attribute: 0,
            graph: 0
        }]
    );
    assert_eq!(t.node_index, 0);
    assert_eq!(p.skipped.len(), 1);
    assert!(
        p.skipped[0].detail.contains("inside the subgraph"),
        "{:?}",
        p.skipped
    );
}

fn int8() -> Recipe {
    Recipe::Int8(Int8Settings::default())
}

fn fp16() -> Recipe {
    fn no_cast(b: &[u8]) -> Vec<u8> {
        vec![0; b.len() / 2]
    }
    Recipe::Fp16(Fp16Settings {
        convert: no_cast,
        op_block_list: None,
    })
}

#[test]
fn int8_plan_follows_quantize_dynamic() {
    let mut gemm_no_c_beta = node("Gemm", "g_beta", &["X", "G"], "Y3");
    gemm_no_c_beta.attribute.push(attr_f("beta", 0.5));
    let mut gemm_t = node("Gemm", "g_t", &["X", "G"], "Y4");
    gemm_t.attribute.push(attr_i("transB", 1));
    let m = model(
        vec![
            node("MatMul", "mm3d", &["X", "W3"], "Y1"),
            node("MatMul", "const_a", &["C", "W"], "Y2"),
            gemm_no_c_beta,
            gemm_t,
            node("MatMul", "half", &["X", "H"], "Y5"),
        ],
        vec![
            tensor("W3", 1, &[2, 8, 4]),
            tensor("W", 1, &[8, 4]),
            tensor("C", 1, &[2, 8]),
            tensor("G", 1, &[4, 8]),
            tensor("H", 10, &[8, 4]),
        ],
        &["X"],
    );
    let p = plan_for(&m, &int8()).unwrap();
    let got: Vec<(&str, bool, Vec<u64>)> = p
        .targets
        .iter()
        .map(|t| (t.node.name.as_str(), t.transposed, t.dims.clone()))
        .collect();
    // Any rank for MatMul; a transB = 1 Gemm is read transposed.
    assert_eq!(
        got,
        [("mm3d", false, vec![2, 8, 4]), ("g_t", true, vec![4, 8])]
    );
    let why: Vec<(&str, &str)> = p
        .skipped
        .iter()
        .map(|s| (s.node.as_str(), s.reason.as_str()))
        .collect();
    assert_eq!(
        why,
        [
            ("const_a", "A is a constant"),
            ("g_beta", "beta is not 1"),
            ("half", "B is not FLOAT"),
        ]
    );
    // The int4 plan of the same model differs where the rules differ.
    let p4 = plan(&m).unwrap();
    assert!(p4.targets.iter().any(|t| t.node.name == "g_beta"));
    assert!(p4.targets.iter().any(|t| t.node.name == "half"));
    // MatMul, Gather and Conv are the op types taken.
    let e = Int8Settings {
        op_types: vec!["MatMul".into(), "Attention".into()],
        ..Default::default()
    }
    .validate()
    .unwrap_err();
    assert!(
        e.to_string().contains("\"Attention\" is not supported"),
        "{e}"
    );
    assert!(e.to_string().contains("MatMul, Gather, Conv"), "{e}");
    assert!(Int8Settings::parse_weight_type("int4")
        .unwrap_err()
        .to_string()
        .contains("\"int4\""));
    assert_eq!(
        int8().packer_params(&Op::MatMul, true),
        [
            "weight_type=int8",
            "symmetric=true",
            "per_channel=false",
            "reduce_range=false",
            "transposed=true"
        ]
    );
}

fn int8_with(op_types: &[&str], per_channel: bool) -> Recipe {
    Recipe::Int8(Int8Settings {
        op_types: op_types.iter().map(|o| o.to_string()).collect(),
        per_channel,
        ..Default::default()
    })
}

#[test]
fn int8_plan_takes_gather_and_conv_as_asked() {
    let m = model(
        vec![
            node("Gather", "embed", &["E", "ids"], "x"),
            node("MatMul", "mm", &["x", "W"], "h"),
            node("Conv", "conv", &["img", "K", "KB"], "c"),
            node("Gather", "fp16_table", &["H", "ids"], "hx"),
            node("Gather", "computed", &["x", "ids"], "xx"),
        ],
        vec![
            tensor("E", 1, &[10, 8]),
            tensor("W", 1, &[8, 4]),
            tensor("K", 1, &[4, 3, 3, 3]),
            tensor("KB", 1, &[4]),
            tensor("H", 10, &[10, 8]),
        ],
        &["ids", "img"],
    );
    let p = plan_for(&m, &int8_with(&["MatMul", "Gather", "Conv"], false)).unwrap();
    let got: Vec<(&str, Op)> = p
        .targets
        .iter()
        .map(|t| (t.node.name.as_str(), t.op.clone()))
        .collect();
    assert_eq!(
        got,
        [
            ("embed", Op::Gather),
            ("mm", Op::MatMul),
            (
                "conv",
                Op::Conv {
                    bias: Some("KB".into())
                }
            ),
        ]
    );
    let why: Vec<(&str, &str)> = p
        .skipped
        .iter()
        .map(|s| (s.node.as_str(), s.reason.as_str()))
        .collect();
    assert_eq!(
        why,
        [
            ("fp16_table", "data is not FLOAT"),
            ("computed", "data is computed, not a weight")
        ]
    );
    // Each weight is packed as the op reading it asks: the table as an
    // activation (uint8, asymmetric), the Conv weight per tensor.
    let params: HashMap<String, Vec<String>> = p
        .packs(&int8_with(&["MatMul"], true))
        .into_iter()
        .map(|p| (p.key.0, p.params))
        .collect();
    assert!(params["E"].contains(&"weight_type=uint8".to_string()));
    assert!(params["E"].contains(&"symmetric=false".to_string()));
    assert!(params["K"].contains(&"per_channel=false".to_string()));
    assert!(params["W"].contains(&"per_channel=true".to_string()));
    // The default op types leave Gather and Conv alone.
    let p = plan_for(&m, &int8()).unwrap();
    assert_eq!(p.targets.len(), 1);
    // Asked for Conv only, a model without one says so (not "no MatMul").
    let matmul = model(
        vec![node("MatMul", "mm", &["X", "W"], "h")],
        vec![tensor("W", 1, &[8, 4])],
        &["X"],
    );
    let why = plan_for(&matmul, &int8_with(&["Conv"], false))
        .unwrap()
        .why_nothing()
        .unwrap();
    assert_eq!(
        why,
        "the model has no node of the op types rewritten (Conv)"
    );
}

#[test]
fn int8_gather_of_a_weight_quantized_per_channel_first_is_left_alone() {
    let m = model(
        vec![
            node("MatMul", "mm", &["X", "T"], "h"),
            node("Gather", "embed", &["T", "ids"], "x"),
        ],
        vec![tensor("T", 1, &[8, 8])],
        &["X", "ids"],
    );
    let p = plan_for(&m, &int8_with(&["MatMul", "Gather"], true)).unwrap();
    assert_eq!(p.targets.len(), 1);
    assert_eq!(p.skipped.len(), 1);
    assert_eq!(
        p.skipped[0].reason,
        "weight quantized per channel by an earlier MatMul"
    );
    // Per tensor, the Gather reads the MatMul's quantized weight.
    let p = plan_for(&m, &int8_with(&["MatMul", "Gather"], false)).unwrap();
    assert_eq!(p.targets.len(), 2);
}

#[test]
fn fp16_plan_takes_read_float_initializers_and_refuses_what_it_cannot_convert() {
    let m = model(
        vec![
            node("MatMul", "mm", &["X", "W"], "h"),
            node("Add", "add", &["h", "I"], "Y"),
        ],
        vec![
            tensor("W", 1, &[8, 4]),
            tensor("unread", 1, &[3]),
            tensor("I", 6, &[4]),
        ],
        &["X"],
    );
    let p = plan_for(&m, &fp16()).unwrap();
    assert_eq!(p.tensors, ["W"]);
    assert_eq!(p.weights(), [("W".to_string(), false)]);
    assert!(p.why_nothing().is_none());
}

/// A model whose inputs are FLOAT tensors.
fn float_model(nodes: Vec<pb::NodeProto>, inits: Vec<pb::TensorProto>, inputs: &[&str]) -> Model {
    use pb::type_proto::{Tensor, Value};
    let mut p = pb::ModelProto::decode(model(nodes, inits, inputs).bytes().clone()).unwrap();
    for vi in &mut p.graph.as_mut().unwrap().input {
        vi.r#type = Some(pb::TypeProto {
            value: Some(Value::TensorType(Tensor {
                elem_type: 1,
                shape: None,
            })),
            ..Default::default()
        });
    }
    Model::from_bytes(Bytes::from(p.encode_to_vec()), ".").unwrap()
}

#[test]
fn fp16_plan_keeps_block_list_nodes_and_float_inputs_as_the_converter_does() {
    let mut resize = node("Resize", "rs", &["h", "", "S"], "r");
    resize.output = vec!["r".into()];
    let m = float_model(
        vec![
            node("MatMul", "mm", &["X", "W"], "h"),
            node("Max", "max", &["h", "M"], "m"),
            node("TopK", "top", &["m", "K"], "Y"),
            resize,
            node("Shape", "shape", &["r"], "s"),
        ],
        vec![
            tensor("W", 1, &[8, 4]),
            tensor("M", 1, &[4]),
            tensor("K", 7, &[1]),
            tensor("S", 1, &[2]),
        ],
        &["X"],
    );
    let p = plan_for(&m, &fp16()).unwrap();
    // M is read by a kept node only, S as Resize's scales: both stay FLOAT.
    assert_eq!(p.tensors, ["W"]);
    let f = p.fp16.unwrap();
    for v in ["X", "W", "h", "m", "r"] {
        assert!(
            f.float16.contains(v),
            "{v} is FLOAT16 in the converter's model"
        );
    }
    for v in ["M", "S", "K", "s"] {
        assert!(!f.float16.contains(v), "{v} stays as it is");
    }
}

#[test]
fn fp16_plan_keeps_the_op_block_list_asked() {
    let m = float_model(
        vec![
            node("MatMul", "mm", &["X", "W"], "h"),
            node("Relu", "relu", &["h"], "r"),
            node("TopK", "top", &["r", "K"], "Y"),
        ],
        vec![tensor("W", 1, &[8, 4]), tensor("K", 7, &[1])],
        &["X"],
    );
    let Recipe::Fp16(mut only_relu) = fp16() else {
        unreachable!("fp16() is the fp16 recipe")
    };
    only_relu.op_block_list = Some(vec!["Relu".into()]);
    let p = plan_for(&m, &Recipe::Fp16(only_relu.clone())).unwrap();
    assert_eq!(p.tensors, ["W"]);
    let f = p.fp16.unwrap();
    // Relu is kept: h is cast back to FLOAT for it and r is FLOAT16 after
    // its Cast; TopK is converted like any other node.
    assert!(f.float16.contains("h") && f.float16.contains("r"));
    let top = node("TopK", "t", &[], "x");
    assert_eq!(
        plan::fp16_node(&top, 17, &only_relu),
        plan::Fp16Node::Converted
    );
}

#[test]
fn fp16_plan_takes_a_resize_in_a_subgraph_whose_scales_are_the_top_graphs() {
    // Only Resize's scales are cast back to FLOAT (at the top level, where
    // they are defined); its data input, made in the branch, is not.
    let mut resize = node("Resize", "rs", &["h", "", "S"], "r");
    resize.output = vec!["r".into()];
    let branch = pb::GraphProto {
        name: "then".into(),
        node: vec![node("Relu", "relu", &["X"], "h"), resize],
        output: values(&["r"]),
        ..Default::default()
    };
    let mut iff = node("If", "if", &["C"], "Y");
    iff.attribute.push(pb::AttributeProto {
        name: "then_branch".into(),
        r#type: pb::attribute_proto::AttributeType::Graph as i32,
        g: Some(branch.clone()),
        ..Default::default()
    });
    iff.attribute.push(pb::AttributeProto {
        name: "else_branch".into(),
        r#type: pb::attribute_proto::AttributeType::Graph as i32,
        g: Some(branch),
        ..Default::default()
    });
    let m = float_model(vec![iff], vec![tensor("S", 1, &[2])], &["X", "C"]);
    let p = plan_for(&m, &fp16()).unwrap();
    assert!(p.fp16.unwrap().float16.contains("h"));
}

#[test]
fn fp16_plan_refuses_what_onnxruntime_would_refuse_of_the_converters_model() {
    let m = float_model(
        vec![node("DynamicQuantizeLinear", "q", &["X"], "xq")],
        vec![],
        &["X"],
    );
    let e = plan_for(&m, &fp16()).unwrap_err().to_string();
    assert!(
        e.contains("node q (DynamicQuantizeLinear) reads \"X\""),
        "{e}"
    );
    assert!(e.contains("takes FLOAT only"), "{e}");
    let m = model(
        vec![node("Add", "add", &["X", "I"], "Y")],
        vec![tensor("I", 6, &[4])],
        &["X"],
    );
    let e = plan_for(&m, &fp16()).unwrap_err().to_string();
    assert!(e.contains("no FLOAT value or weight"), "{e}");
}
