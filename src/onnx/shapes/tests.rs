use super::*;

/// The value_info of `m`, its nodes and initializers decoded here.
fn inferred(m: &Model) -> crate::Result<Vec<pb::ValueInfoProto>> {
    inferred_value_info(m, &m.nodes()?, &m.initializers()?)
}

fn node(op: &str, inputs: &[&str], output: &str) -> pb::NodeProto {
    pb::NodeProto {
        op_type: op.into(),
        name: output.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

fn float_input(name: &str, dims: &[Dim]) -> pb::ValueInfoProto {
    value_info(name, DataType::FLOAT.code(), Some(&dims.to_vec()))
}

fn param(p: &str) -> Dim {
    Dim::Param(p.into())
}

fn shape_of(vi: &pb::ValueInfoProto) -> Vec<Dim> {
    tensor_shape(vi).expect("a shape")
}

fn model(nodes: Vec<pb::NodeProto>, inits: Vec<pb::TensorProto>) -> Model {
    let graph = pb::GraphProto {
        name: "g".into(),
        node: nodes,
        initializer: inits,
        input: vec![float_input(
            "x",
            &[param("unk__0"), param("s"), Dim::Value(8)],
        )],
        output: vec![pb::ValueInfoProto {
            name: "out".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    Model::of_graph(graph, 17)
}

fn int64s(name: &str, values: &[i64]) -> pb::TensorProto {
    pb::TensorProto {
        name: name.into(),
        data_type: DataType::INT64.code(),
        dims: vec![values.len() as i64],
        raw_data: values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>()
            .into(),
        ..Default::default()
    }
}

#[test]
fn unknown_dimensions_get_fresh_symbols_as_onnx_names_them() {
    // A Reshape to a shape computed at run time has as many dimensions as
    // the shape has values, none known: onnx names them unk__1.. (unk__0
    // is the model's own), and an Add of it with x broadcasts two
    // different symbols to a fresh one.
    let m = model(
        vec![
            node("Shape", &["x"], "shape"),
            node("Reshape", &["x", "shape"], "r"),
            node("Add", &["r", "x"], "sum"),
            node("Reshape", &["x", "keep"], "same"),
            node("Relu", &["same"], "out"),
        ],
        vec![int64s("keep", &[0, 0, -1])],
    );
    let vi = inferred(&m).unwrap();
    let names: Vec<&str> = vi.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["shape", "r", "sum", "same", "out"]);
    assert_eq!(shape_of(&vi[0]), [Dim::Value(3)]);
    assert_eq!(
        shape_of(&vi[1]),
        [param("unk__1"), param("unk__2"), param("unk__3")]
    );
    assert_eq!(
        shape_of(&vi[2]),
        [param("unk__4"), param("unk__5"), Dim::Value(8)]
    );
    // 0 copies the input's dimension, -1 is what is left of it.
    assert_eq!(
        shape_of(&vi[3]),
        [param("unk__0"), param("s"), Dim::Value(8)]
    );
    let elem = |v: &pb::ValueInfoProto| match v.r#type.as_ref().unwrap().value.as_ref().unwrap() {
        pb::type_proto::Value::TensorType(t) => t.elem_type,
        _ => 0,
    };
    assert_eq!(elem(&vi[0]), DataType::INT64.code());
    assert_eq!(elem(&vi[2]), DataType::FLOAT.code());
}

#[test]
fn ops_not_written_here_stay_untyped() {
    let mut custom = node("Custom", &["x"], "c");
    custom.domain = "com.example".into();
    let m = model(
        vec![
            custom,
            node("Relu", &["c"], "r"),
            node("NonZero", &["x"], "nz"),
            node("Relu", &["x"], "out"),
        ],
        vec![],
    );
    let vi = inferred(&m).unwrap();
    // Relu of an untyped value has no type either; NonZero is not written
    // here; the graph's output, declared without a type, gets one.
    let names: Vec<&str> = vi.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["out"]);
}

fn ints(name: &str, ints: &[i64]) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        ints: ints.to_vec(),
        r#type: 7,
        ..Default::default()
    }
}

#[test]
fn hostile_numbers_fail_the_node_never_the_process() {
    // Pads and dilations that overflow, a slice of a negative dimension,
    // Unsqueezes past the rank bound: each such node is left untyped (as
    // onnx fails it), and the rest is inferred.
    let mut conv = node("Conv", &["x", "w"], "c");
    conv.attribute = vec![
        ints("pads", &[i64::MAX, i64::MAX]),
        ints("dilations", &[i64::MAX]),
    ];
    let wide = node("Unsqueeze", &["x", "many"], "u1");
    let mut negative = node("Constant", &[], "neg");
    negative.attribute = vec![pb::AttributeProto {
        name: "value".into(),
        t: Some(pb::TensorProto {
            data_type: DataType::FLOAT.code(),
            dims: vec![-5],
            ..Default::default()
        }),
        r#type: 4,
        ..Default::default()
    }];
    let m = model(
        vec![
            conv,
            wide,
            node("Unsqueeze", &["u1", "many"], "u2"),
            negative,
            node("Slice", &["neg", "zero", "one"], "s"),
            node("ConstantOfShape", &["minus"], "filled"),
            node("Relu", &["x"], "out"),
        ],
        vec![
            pb::TensorProto {
                name: "w".into(),
                data_type: DataType::FLOAT.code(),
                dims: vec![4, 8, 3],
                raw_data: vec![0u8; 4 * 96].into(),
                ..Default::default()
            },
            int64s("many", &(0..200).collect::<Vec<_>>()),
            int64s("zero", &[0]),
            int64s("minus", &[2, -3]),
            int64s("one", &[1]),
        ],
    );
    let vi = inferred(&m).unwrap();
    let by_name = |n: &str| vi.iter().find(|v| v.name == n);
    for failed in ["c", "s", "filled"] {
        assert!(by_name(failed).is_none(), "{failed}: {vi:?}");
    }
    // 203 dimensions are kept; 403 are past the bound: a type alone.
    assert_eq!(shape_of(by_name("u1").unwrap()).len(), 203);
    assert!(tensor_shape(by_name("u2").unwrap()).is_none());
    assert!(by_name("out").is_some());
}

#[test]
fn a_model_whose_shapes_would_hold_too_much_gets_no_value_info() {
    // One input dimension named by a 1 MiB symbol, carried through a chain
    // of 100 Identity nodes: 100 MiB of shapes, past the bound.
    let long = "s".repeat(1 << 20);
    let mut nodes = vec![node("Identity", &["x"], "i0")];
    for i in 1..100 {
        nodes.push(node(
            "Identity",
            &[&format!("i{}", i - 1)],
            &format!("i{i}"),
        ));
    }
    let graph = pb::GraphProto {
        name: "g".into(),
        node: nodes,
        input: vec![float_input("x", &[param(&long)])],
        ..Default::default()
    };
    let m = Model::of_graph(graph, 17);
    assert!(inferred(&m).unwrap().is_empty());
}
