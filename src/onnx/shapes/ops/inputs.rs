//! What a node's inference function reads (its inputs' shapes and
//! constant values, its attributes) and what it yields.

use crate::onnx::graph::attr;
use crate::onnx::shapes::dims::{Dim, Shape};
use crate::pb;

/// What onnx's inference function yields for a node.
pub(crate) enum Outcome {
    /// Each output's shape (`None`: a type without a shape).
    Shapes(Vec<Option<Shape>>),
    /// The function fails (an error onnx records): no output is typed.
    Fails,
    /// Not an op written here.
    Unsupported,
}

/// What the inference function of a node may read.
pub(crate) struct Inputs<'a> {
    /// Each input's shape, if it has a type with a shape.
    pub shapes: Vec<Option<&'a Shape>>,
    /// Each input's constant INT64 or INT32 values (an initializer or a
    /// Constant node's output), if it has them.
    pub data: Vec<Option<&'a [i64]>>,
    /// Whether each input is present (a non-empty name with a type).
    pub typed: Vec<bool>,
}

impl<'a> Inputs<'a> {
    pub(crate) fn shape(&self, i: usize) -> Option<&'a Shape> {
        self.shapes.get(i).copied().flatten()
    }

    pub(crate) fn data(&self, i: usize) -> Option<&'a [i64]> {
        self.data.get(i).copied().flatten()
    }

    pub(crate) fn all_shapes(&self) -> Option<Vec<&'a Shape>> {
        self.shapes.iter().copied().collect()
    }

    /// onnx's `getShapeInput`: the values of a shape input, else its rank
    /// from its own one-dimensional shape.
    pub(crate) fn shape_input(&self, i: usize) -> Option<Shape> {
        if let Some(v) = self.data(i) {
            return Some(v.iter().map(|&d| Dim::Value(d)).collect());
        }
        match self.shape(i)?.as_slice() {
            [Dim::Value(n)] if (0..=64).contains(n) => Some(vec![Dim::Unknown; *n as usize]),
            _ => None,
        }
    }
}

pub(crate) fn int_attr(n: &pb::NodeProto, name: &str) -> Option<i64> {
    attr(n, name).map(|a| a.i)
}

pub(crate) fn ints_attr(n: &pb::NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(n, name).map(|a| a.ints.clone())
}

/// `axis` made non-negative for `rank`; `None` when out of range.
pub(crate) fn axis_in(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Every axis of `axes` made non-negative for `rank`; `None` when one is
/// out of range.
pub(crate) fn axes_in(axes: &[i64], rank: usize) -> Option<Vec<usize>> {
    axes.iter().map(|&a| axis_in(a, rank)).collect()
}
