//! The `onnxruntime-fp16` plan: which FLOAT initializers the float16
//! converter turns into FLOAT16, and the models this target refuses.

use std::collections::HashSet;

use super::{graph_value_names, Plan, GRAPH_INPUT};
use crate::dtype::DataType;
use crate::error::Result;
use crate::onnx::graph::node_label;
use crate::onnx::Model;

/// Op types the float16 converter keeps in FLOAT behind Casts (its
/// `DEFAULT_OP_BLOCK_LIST`), or treats specially (FLOAT-only inputs,
/// `dtype` attributes): this target refuses models with them rather than
/// guess the value types it would need shape inference for.
const FP16_REFUSED_OPS: &[&str] = &[
    "ArrayFeatureExtractor",
    "Binarizer",
    "CastMap",
    "CategoryMapper",
    "DictVectorizer",
    "FeatureVectorizer",
    "Imputer",
    "LabelEncoder",
    "LinearClassifier",
    "LinearRegressor",
    "Normalizer",
    "OneHotEncoder",
    "RandomUniformLike",
    "SVMClassifier",
    "SVMRegressor",
    "Scaler",
    "TreeEnsembleClassifier",
    "TreeEnsembleRegressor",
    "TreeEnsemble",
    "ZipMap",
    "NonMaxSuppression",
    "TopK",
    "RoiAlign",
    "Range",
    "CumSum",
    "Min",
    "Max",
    "Upsample",
    "Resize",
    "GroupNorm",
    "SkipGroupNorm",
    "EyeLike",
    "Multinomial",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "SequenceEmpty",
    "Bernoulli",
    "ConstantOfShape",
];

/// The `onnxruntime-fp16` plan: every FLOAT top-level initializer a
/// top-level node reads (the converter leaves unread ones FLOAT). Refused,
/// naming the node: ops of [`FP16_REFUSED_OPS`], subgraphs, and a FLOAT
/// initializer that is also a graph input.
pub(super) fn plan_fp16(model: &Model) -> Result<Plan> {
    let refuse = |what: String| Err(crate::Error::Rewrite(format!("materialize: {what}")));
    let nodes = model.nodes()?;
    let mut read: HashSet<&str> = HashSet::new();
    for (i, n) in nodes.iter().enumerate() {
        let name = node_label(n, i);
        if FP16_REFUSED_OPS.contains(&n.op_type.as_str()) {
            return refuse(format!(
                "node {name} is a {}, which the float16 converter keeps in FLOAT or treats specially;                  onnxruntime-fp16 does not take it",
                n.op_type
            ));
        }
        if n.attribute
            .iter()
            .any(|a| a.g.is_some() || !a.graphs.is_empty())
        {
            return refuse(format!(
                "node {name} ({}) holds a subgraph; onnxruntime-fp16 converts top-level graphs only",
                n.op_type
            ));
        }
        read.extend(n.input.iter().map(String::as_str));
    }
    let inputs: HashSet<String> = graph_value_names(model, GRAPH_INPUT)?.into_iter().collect();
    let mut tensors = Vec::new();
    for t in model.initializers()? {
        if t.data_type != DataType::FLOAT || !read.contains(t.name.as_str()) {
            continue;
        }
        if inputs.contains(&t.name) {
            return refuse(format!(
                "FLOAT initializer {:?} is also a graph input; onnxruntime-fp16 does not take it",
                t.name
            ));
        }
        tensors.push(t.name.clone());
    }
    if tensors.is_empty() {
        return refuse(
            "nothing to materialize: the model has no FLOAT initializer that a node reads".into(),
        );
    }
    Ok(Plan {
        tensors,
        ..Plan::default()
    })
}
