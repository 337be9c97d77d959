//! The weight-use analysis (`onnx::graph::weight_uses`): which initializers
//! feed MatMul / Gemm input B, through which value-preserving ops, seen
//! transposed or not, and which weight-like inputs are not sources.

use ctcache::onnx::graph::{weight_uses, UseSite, WeightUses};
use ctcache::onnx::Model;
use ctcache::pb;
use prost::Message;

fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> pb::NodeProto {
    pb::NodeProto {
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn with_attr(mut n: pb::NodeProto, a: pb::AttributeProto) -> pb::NodeProto {
    n.attribute.push(a);
    n
}

fn weight(name: &str) -> pb::TensorProto {
    pb::TensorProto {
        name: name.into(),
        data_type: 1,
        dims: vec![1],
        raw_data: vec![0u8; 4].into(),
        ..Default::default()
    }
}

fn analyse(nodes: Vec<pb::NodeProto>) -> WeightUses {
    let graph = pb::GraphProto {
        node: nodes,
        initializer: ["w0", "w1", "w2", "w3"].map(weight).to_vec(),
        ..Default::default()
    };
    let m = pb::ModelProto {
        ir_version: 8,
        graph: Some(graph),
        ..Default::default()
    };
    weight_uses(&Model::from_bytes(m.encode_to_vec().into(), "/").unwrap()).unwrap()
}

#[test]
fn uses_are_found_through_identity_and_transpose() {
    let perm = |ints: Vec<i64>| pb::AttributeProto {
        name: "perm".into(),
        ints,
        r#type: 7,
        ..Default::default()
    };
    let trans_b = pb::AttributeProto {
        name: "transB".into(),
        i: 1,
        r#type: 2,
        ..Default::default()
    };
    let mut foreign = node("Identity", &["w3"], &["f"]);
    foreign.domain = "com.example".into();
    let out = analyse(vec![
        node("Identity", &["w0"], &["i"]),
        with_attr(node("Transpose", &["i"], &["t"]), perm(vec![1, 0])),
        node("MatMul", &["x", "t"], &["y0"]),
        with_attr(node("Gemm", &["x", "w1"], &["y1"]), trans_b),
        with_attr(node("Transpose", &["w2"], &["t3"]), perm(vec![0, 1])),
        node("MatMul", &["x", "t3"], &["y2"]),
        node("MatMul", &["x", "f"], &["y3"]),
    ]);
    let got: Vec<_> = out
        .uses
        .iter()
        .map(|u| {
            (
                u.initializer.as_str(),
                u.site,
                u.node.as_str(),
                u.transposed,
                u.via.join(">"),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "w0",
                UseSite::MatMulB,
                "#2",
                true,
                "Transpose>Identity".to_string()
            ),
            ("w1", UseSite::GemmB, "#3", true, String::new()),
        ],
        "a Transpose other than a 2-D swap and an Identity of another domain stop the walk"
    );
}

#[test]
fn computed_and_constant_weights_and_subgraph_initializers_are_not_sources() {
    let mut branch = pb::GraphProto::default();
    branch.initializer.push(weight("inner"));
    let if_node = with_attr(
        node("If", &["cond"], &["z"]),
        pb::AttributeProto {
            name: "then_branch".into(),
            g: Some(branch),
            r#type: 5,
            ..Default::default()
        },
    );
    let out = analyse(vec![
        node("Constant", &[], &["k"]),
        node("MatMul", &["x", "k"], &["y0"]),
        node("DequantizeLinear", &["w0", "s"], &["dq"]),
        node("Gemm", &["x", "dq"], &["y1"]),
        if_node,
        // The last node naming an output produces it: this Relu replaces
        // the Identity that named `r` first, and the walk stops there.
        node("Identity", &["w1"], &["r"]),
        node("Relu", &["x"], &["r"]),
        node("MatMul", &["x", "r"], &["y2"]),
    ]);
    assert!(out.uses.is_empty(), "{:?}", out.uses);
    let not: Vec<_> = out
        .not_sources
        .iter()
        .map(|n| {
            (
                n.name.as_str(),
                n.reason.split(' ').take(5).collect::<Vec<_>>().join(" "),
            )
        })
        .collect();
    assert_eq!(
        not,
        vec![
            ("k", "MatMul.B input is a Constant".to_string()),
            ("dq", "Gemm.B input is computed by".to_string()),
            ("inner", "initializer of a subgraph of".to_string()),
        ]
    );
}

#[test]
fn gather_tables_and_conv_weights_are_uses_and_never_reported_as_not_sources() {
    let out = analyse(vec![
        node("Gather", &["w0", "ids"], &["e"]),
        node("Conv", &["img", "w1", "w2"], &["c"]),
        node("Constant", &[], &["k"]),
        node("Gather", &["k", "ids"], &["e2"]),
        node("DequantizeLinear", &["w3", "s"], &["dq"]),
        node("Conv", &["img", "dq"], &["c2"]),
    ]);
    let got: Vec<_> = out
        .uses
        .iter()
        .map(|u| (u.initializer.as_str(), u.site.name(), u.transposed))
        .collect();
    assert_eq!(
        got,
        [("w0", "Gather.data", false), ("w1", "Conv.W", false)],
        "the Conv bias is no weight use"
    );
    assert!(out.not_sources.is_empty(), "{:?}", out.not_sources);
}
