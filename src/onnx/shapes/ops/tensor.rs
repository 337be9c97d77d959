//! Shape inference of onnx's tensor ops (`onnx/defs/tensor`).

use super::inputs::{axes_in, axis_in, int_attr, ints_attr, Inputs, Outcome};
use crate::onnx::shapes::dims::{merge_dim, Dim};
use crate::pb;

pub(super) fn gather(n: &pb::NodeProto, inputs: &Inputs<'_>) -> Outcome {
    let (Some(data), Some(indices)) = (inputs.shape(0), inputs.shape(1)) else {
        return Outcome::Shapes(vec![None]);
    };
    let Some(axis) = axis_in(int_attr(n, "axis").unwrap_or(0), data.len()) else {
        return Outcome::Fails;
    };
    let mut out = data[..axis].to_vec();
    out.extend(indices.iter().cloned());
    out.extend(data[axis + 1..].iter().cloned());
    Outcome::Shapes(vec![Some(out)])
}

pub(super) fn unsqueeze(n: &pb::NodeProto, opset: i64, inputs: &Inputs<'_>) -> Outcome {
    let Some(input) = inputs.shape(0) else {
        return Outcome::Shapes(vec![None]);
    };
    let axes = if opset >= 13 {
        inputs.data(1).map(<[i64]>::to_vec)
    } else {
        ints_attr(n, "axes")
    };
    let Some(axes) = axes else {
        return Outcome::Shapes(vec![None]);
    };
    let rank = input.len() + axes.len();
    let Some(mut axes) = axes_in(&axes, rank) else {
        return Outcome::Fails;
    };
    axes.sort_unstable();
    if axes.windows(2).any(|w| w[0] == w[1]) {
        return Outcome::Fails;
    }
    let mut out = Vec::with_capacity(rank);
    let mut dims = input.iter();
    for i in 0..rank {
        if axes.binary_search(&i).is_ok() {
            out.push(Dim::Value(1));
        } else if let Some(d) = dims.next() {
            out.push(d.clone());
        }
    }
    Outcome::Shapes(vec![Some(out)])
}

pub(super) fn squeeze(n: &pb::NodeProto, opset: i64, inputs: &Inputs<'_>) -> Outcome {
    let Some(input) = inputs.shape(0) else {
        return Outcome::Shapes(vec![None]);
    };
    let axes = if opset >= 13 {
        if inputs.typed.get(1).copied().unwrap_or(false) {
            match inputs.data(1) {
                Some(a) => Some(a.to_vec()),
                None => return Outcome::Shapes(vec![None]),
            }
        } else {
            None
        }
    } else {
        ints_attr(n, "axes")
    };
    let out = match axes {
        None => {
            if input.iter().any(|d| !matches!(d, Dim::Value(_))) {
                return Outcome::Shapes(vec![None]);
            }
            input
                .iter()
                .filter(|d| **d != Dim::Value(1))
                .cloned()
                .collect()
        }
        Some(axes) => {
            let Some(axes) = axes_in(&axes, input.len()) else {
                return Outcome::Fails;
            };
            let mut out = Vec::new();
            for (i, d) in input.iter().enumerate() {
                if axes.contains(&i) {
                    if matches!(d, Dim::Value(v) if *v != 1) {
                        return Outcome::Fails;
                    }
                } else {
                    out.push(d.clone());
                }
            }
            out
        }
    };
    Outcome::Shapes(vec![Some(out)])
}

pub(super) fn concat(n: &pb::NodeProto, inputs: &Inputs<'_>) -> Outcome {
    let Some(shapes) = inputs.all_shapes().filter(|s| !s.is_empty()) else {
        return Outcome::Shapes(vec![None]);
    };
    let rank = shapes[0].len();
    let Some(axis) = int_attr(n, "axis").and_then(|a| axis_in(a, rank)) else {
        return Outcome::Fails;
    };
    if shapes.len() == 1 {
        return Outcome::Shapes(vec![Some(shapes[0].clone())]);
    }
    let mut out = vec![Dim::Unknown; rank];
    let mut total = Some(0i64);
    for s in &shapes {
        if s.len() != rank {
            return Outcome::Fails;
        }
        for (j, d) in s.iter().enumerate() {
            if j == axis {
                total = match (total, d) {
                    (Some(t), Dim::Value(v)) if *v >= 0 => t.checked_add(*v),
                    _ => None,
                };
            } else {
                if let (Dim::Value(a), Dim::Value(b)) = (d, &out[j]) {
                    if a != b {
                        return Outcome::Fails;
                    }
                }
                merge_dim(d, &mut out[j]);
            }
        }
    }
    if let Some(t) = total {
        out[axis] = Dim::Value(t);
    }
    Outcome::Shapes(vec![Some(out)])
}

pub(super) fn reshape(n: &pb::NodeProto, inputs: &Inputs<'_>) -> Outcome {
    let Some(target) = inputs.shape_input(1) else {
        return Outcome::Shapes(vec![None]);
    };
    let allow_zero = int_attr(n, "allowzero").unwrap_or(0) != 0;
    let data = inputs.shape(0);
    let mut out = Vec::with_capacity(target.len());
    let mut minus_one = None;
    let mut unresolved_zero = vec![false; target.len()];
    let mut product = Some(1i64);
    for (i, d) in target.iter().enumerate() {
        match d {
            Dim::Value(-1) => {
                if minus_one.replace(i).is_some() {
                    return Outcome::Fails;
                }
                out.push(Dim::Unknown);
            }
            Dim::Value(0) if !allow_zero => {
                unresolved_zero[i] = true;
                let from = match data {
                    Some(s) => match s.get(i) {
                        Some(d) => d.clone(),
                        None => return Outcome::Fails,
                    },
                    None => Dim::Unknown,
                };
                if let Dim::Value(v) = from {
                    unresolved_zero[i] = false;
                    product = product.and_then(|p| p.checked_mul(v));
                }
                out.push(from);
            }
            Dim::Value(v) if *v >= 0 => {
                product = product.and_then(|p| p.checked_mul(*v));
                out.push(Dim::Value(*v));
            }
            Dim::Value(_) => return Outcome::Fails,
            other => {
                product = None;
                out.push(other.clone());
            }
        }
    }
    if let (Some(i), Some(p)) = (minus_one, product) {
        if p == 0 {
            return Outcome::Fails;
        }
        let input_product = data.and_then(|s| {
            s.iter().enumerate().try_fold(1i64, |acc, (j, d)| match d {
                Dim::Value(v) => acc.checked_mul(*v),
                _ if unresolved_zero.get(j).copied().unwrap_or(false) => Some(acc),
                _ => None,
            })
        });
        if let Some(total) = input_product {
            // Checked: declared dimensions may be negative in a hostile
            // model (i64::MIN / -1 overflows).
            match (total.checked_rem(p), total.checked_div(p)) {
                (Some(0), Some(q)) => out[i] = Dim::Value(q),
                _ => return Outcome::Fails,
            }
        }
    }
    Outcome::Shapes(vec![Some(out)])
}

pub(super) fn transpose(n: &pb::NodeProto, inputs: &Inputs<'_>) -> Outcome {
    let Some(input) = inputs.shape(0) else {
        return Outcome::Shapes(vec![None]);
    };
    let perm = match ints_attr(n, "perm") {
        Some(p) => p,
        None => (0..input.len() as i64).rev().collect(),
    };
    let mut seen = vec![false; input.len()];
    let mut out = Vec::with_capacity(perm.len());
    for &p in &perm {
        let Some(i) = usize::try_from(p).ok().filter(|&i| i < input.len()) else {
            return Outcome::Fails;
        };
        if std::mem::replace(&mut seen[i], true) {
            return Outcome::Fails;
        }
        out.push(input[i].clone());
    }
    Outcome::Shapes(vec![Some(out)])
}

/// Slice with starts, ends, axes and steps as inputs (opset 10 on).
pub(super) fn slice(inputs: &Inputs<'_>) -> Outcome {
    let Some(input) = inputs.shape(0) else {
        return Outcome::Shapes(vec![None]);
    };
    let has = |i: usize| inputs.shape(i).is_some();
    let (Some(starts), Some(ends)) = (inputs.data(1), inputs.data(2)) else {
        return Outcome::Shapes(vec![Some(vec![Dim::Unknown; input.len()])]);
    };
    if (has(3) && inputs.data(3).is_none()) || (has(4) && inputs.data(4).is_none()) {
        return Outcome::Shapes(vec![Some(vec![Dim::Unknown; input.len()])]);
    }
    if starts.len() != ends.len() {
        return Outcome::Fails;
    }
    let axes: Vec<i64> = match inputs.data(3).filter(|_| has(3)) {
        Some(a) if a.len() == starts.len() => a.to_vec(),
        Some(_) => return Outcome::Fails,
        None => (0..starts.len() as i64).collect(),
    };
    let steps: Vec<i64> = match inputs.data(4).filter(|_| has(4)) {
        Some(s) if s.len() == starts.len() => s.to_vec(),
        Some(_) => return Outcome::Fails,
        None => vec![1; starts.len()],
    };
    let Some(axes) = axes_in(&axes, input.len()) else {
        return Outcome::Fails;
    };
    let mut out = input.clone();
    for (k, &axis) in axes.iter().enumerate() {
        let Dim::Value(dim) = input[axis] else {
            out[axis] = Dim::Unknown;
            continue;
        };
        let Some(len) = slice_len(dim, starts[k], ends[k], steps[k]) else {
            return Outcome::Fails;
        };
        out[axis] = Dim::Value(len);
    }
    Outcome::Shapes(vec![Some(out)])
}

/// The length of one sliced axis, start and end clamped as onnx's
/// `processSliceInputs` clamps them.
fn slice_len(dim: i64, start: i64, end: i64, step: i64) -> Option<i64> {
    if step == 0 || dim < 0 {
        return None;
    }
    if dim == 0 {
        return Some(0);
    }
    let wrap = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
    let (start, end) = if step > 0 {
        (wrap(start).clamp(0, dim), wrap(end).clamp(0, dim))
    } else {
        (wrap(start).clamp(0, dim - 1), wrap(end).clamp(-1, dim - 1))
    };
    let span = end as f64 - start as f64;
    Some(((span / step as f64).ceil() as i64).max(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_lengths_clamp_as_numpy() {
        assert_eq!(slice_len(10, 0, i64::MAX, 1), Some(10));
        assert_eq!(slice_len(10, -3, -1, 1), Some(2));
        assert_eq!(slice_len(10, 9, -11, -1), Some(10));
        assert_eq!(slice_len(10, 5, 2, 1), Some(0));
        assert_eq!(slice_len(10, 0, 10, 3), Some(4));
        assert_eq!(slice_len(10, 0, 10, 0), None);
        assert_eq!(slice_len(0, 0, -1, -1), Some(0));
        assert_eq!(slice_len(-5, 0, 1, 1), None);
        assert_eq!(slice_len(i64::MAX, i64::MIN, i64::MAX, i64::MIN), Some(0));
    }
}
