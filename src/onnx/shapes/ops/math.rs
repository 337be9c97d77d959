//! Shape inference of onnx's math, normalization and reduction ops.

use super::inputs::{axes_in, axis_in, int_attr, ints_attr, Inputs, Outcome};
use crate::onnx::shapes::dims::{broadcast, Dim, Shape};
use crate::pb;

pub(super) fn matmul(inputs: &Inputs<'_>) -> Outcome {
    let (Some(a), Some(b)) = (inputs.shape(0), inputs.shape(1)) else {
        return Outcome::Shapes(vec![None]);
    };
    if a.is_empty() || b.is_empty() {
        return Outcome::Fails;
    }
    let left: Shape = if a.len() == 1 {
        vec![Dim::Value(1), a[0].clone()]
    } else {
        a.clone()
    };
    let right: Shape = if b.len() == 1 {
        vec![b[0].clone(), Dim::Value(1)]
    } else {
        b.clone()
    };
    if let (Dim::Value(k1), Dim::Value(k2)) = (&left[left.len() - 1], &right[right.len() - 2]) {
        if k1 != k2 {
            return Outcome::Fails;
        }
    }
    let prefix_l = left[..left.len() - 2].to_vec();
    let prefix_r = right[..right.len() - 2].to_vec();
    let Some(mut out) = broadcast(&[&prefix_l, &prefix_r]) else {
        return Outcome::Fails;
    };
    if a.len() != 1 {
        out.push(left[left.len() - 2].clone());
    }
    if b.len() != 1 {
        out.push(right[right.len() - 1].clone());
    }
    Outcome::Shapes(vec![Some(out)])
}

pub(super) fn gemm(n: &pb::NodeProto, inputs: &Inputs<'_>) -> Outcome {
    let (Some(a), Some(b)) = (inputs.shape(0), inputs.shape(1)) else {
        return Outcome::Shapes(vec![None]);
    };
    if a.len() != 2 || b.len() != 2 {
        return Outcome::Fails;
    }
    let ta = int_attr(n, "transA").unwrap_or(0) != 0;
    let tb = int_attr(n, "transB").unwrap_or(0) != 0;
    let m = a[usize::from(ta)].clone();
    let k = b[usize::from(!tb)].clone();
    Outcome::Shapes(vec![Some(vec![m, k])])
}

pub(super) fn layer_norm(n: &pb::NodeProto, inputs: &Inputs<'_>) -> Outcome {
    let x = inputs.shape(0);
    let mut outs = vec![x.cloned()];
    if n.output.len() > 1 {
        let stats = x.and_then(|x| {
            let axis = axis_in(int_attr(n, "axis").unwrap_or(-1), x.len())?;
            let mut s = x[..axis].to_vec();
            s.resize(x.len(), Dim::Value(1));
            Some(s)
        });
        outs.push(stats.clone());
        outs.push(stats);
    }
    Outcome::Shapes(outs)
}

pub(super) fn reduce(n: &pb::NodeProto, inputs: &Inputs<'_>) -> Outcome {
    let Some(input) = inputs.shape(0) else {
        return Outcome::Shapes(vec![None]);
    };
    let keep = int_attr(n, "keepdims").unwrap_or(1) == 1;
    let noop = int_attr(n, "noop_with_empty_axes").unwrap_or(0) != 0;
    let axes_input = n.input.get(1).is_some_and(|s| !s.is_empty());
    let axes = if axes_input {
        match inputs.data(1) {
            Some(a) => a.to_vec(),
            None => return Outcome::Shapes(vec![None]),
        }
    } else {
        ints_attr(n, "axes").unwrap_or_default()
    };
    if noop && axes.is_empty() {
        return Outcome::Shapes(vec![Some(input.clone())]);
    }
    let Some(axes) = axes_in(&axes, input.len()) else {
        return Outcome::Fails;
    };
    let mut out = Vec::new();
    for (i, d) in input.iter().enumerate() {
        if !axes.is_empty() && !axes.contains(&i) {
            out.push(d.clone());
        } else if keep {
            out.push(Dim::Value(1));
        }
    }
    Outcome::Shapes(vec![Some(out)])
}
