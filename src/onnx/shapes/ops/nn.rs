//! Shape inference of onnx's convolutions and pools
//! (`convPoolShapeInference`).

use super::inputs::{int_attr, ints_attr, Inputs, Outcome};
use crate::onnx::graph::attr;
use crate::onnx::shapes::dims::{Dim, Shape};
use crate::pb;

/// Which window op a node is.
pub(super) enum Kind {
    /// The kernel is the weight's spatial dimensions.
    Conv,
    /// The kernel is the `kernel_shape` attribute; `dilation`: the op
    /// version reads `dilations`; `legacy_ceil`: before opset 22, onnx
    /// counts a last window in ceil mode wherever it starts.
    Pool { dilation: bool, legacy_ceil: bool },
}

impl Kind {
    pub(super) fn pool(dilation: bool, opset: i64) -> Kind {
        Kind::Pool {
            dilation,
            legacy_ceil: opset < 22,
        }
    }
}

/// onnx's `convPoolShapeInference`: a convolution's or a pool's output.
pub(super) fn conv_pool(n: &pb::NodeProto, inputs: &Inputs<'_>, kind: Kind) -> Outcome {
    let (dilation, kernel_from_attr, legacy_ceil) = match kind {
        Kind::Conv => (true, false, false),
        Kind::Pool {
            dilation,
            legacy_ceil,
        } => (dilation, true, legacy_ceil),
    };
    let Some(x) = inputs.shape(0) else {
        return Outcome::Shapes(vec![None; n.output.len()]);
    };
    let w = inputs.shape(1);
    if !kernel_from_attr && w.is_none() {
        return Outcome::Shapes(vec![None; n.output.len()]);
    }
    if x.len() < 3 {
        return Outcome::Fails;
    }
    let spatial = x.len() - 2;
    let sized = |v: Option<Vec<i64>>| v.filter(|v| v.len() == spatial);
    let dilations = match ints_attr(n, "dilations").filter(|_| dilation) {
        Some(d) => match sized(Some(d)).filter(|d| d.iter().all(|&v| v > 0)) {
            Some(d) => d,
            None => return Outcome::Fails,
        },
        None => vec![1; spatial],
    };
    let strides = match ints_attr(n, "strides") {
        Some(s) => match sized(Some(s)).filter(|s| s.iter().all(|&v| v > 0)) {
            Some(s) => s,
            None => return Outcome::Fails,
        },
        None => vec![1; spatial],
    };
    let kernel = match (ints_attr(n, "kernel_shape"), kernel_from_attr, w) {
        (Some(k), _, _) => k,
        (None, true, _) => return Outcome::Fails,
        (None, false, Some(w)) => {
            let mut k = Vec::new();
            for d in w.iter().skip(2) {
                match d {
                    Dim::Value(v) => k.push(*v),
                    _ => return Outcome::Shapes(vec![None; n.output.len()]),
                }
            }
            k
        }
        (None, false, None) => return Outcome::Fails,
    };
    if kernel.len() != spatial || kernel.iter().any(|&k| k <= 0) {
        return Outcome::Fails;
    }
    // onnx fails the node where its checked arithmetic overflows.
    let Some(effective) = kernel
        .iter()
        .zip(&dilations)
        .map(|(k, d)| (k - 1).checked_mul(*d)?.checked_add(1))
        .collect::<Option<Vec<i64>>>()
    else {
        return Outcome::Fails;
    };
    let pads = match ints_attr(n, "pads") {
        Some(p) if p.len() == 2 * spatial && p.iter().all(|&v| v >= 0) => p,
        Some(_) => return Outcome::Fails,
        None => auto_pads(n, x, &effective, &strides),
    };
    let mut out = vec![x[0].clone()];
    out.push(match (kernel_from_attr, w) {
        (true, _) => x[1].clone(),
        (false, Some(w)) if !w.is_empty() => w[0].clone(),
        _ => return Outcome::Fails,
    });
    let ceil = int_attr(n, "ceil_mode").unwrap_or(0) != 0;
    for i in 0..spatial {
        let Dim::Value(size) = x[2 + i] else {
            out.push(Dim::Unknown);
            continue;
        };
        let len = Window {
            size,
            pads: (pads[i], pads[i + spatial]),
            kernel: effective[i],
            stride: strides[i],
        }
        .outputs(ceil, legacy_ceil);
        match len {
            Some(len) => out.push(Dim::Value(len)),
            None => return Outcome::Fails,
        }
    }
    let mut outs = vec![Some(out.clone())];
    if n.output.len() > 1 {
        outs.push(Some(out));
    }
    Outcome::Shapes(outs)
}

/// One spatial axis of a convolution or pool.
struct Window {
    size: i64,
    pads: (i64, i64),
    /// The kernel with its dilation.
    kernel: i64,
    stride: i64,
}

impl Window {
    /// How many windows fit (`ceil`: a last partial one counts; from
    /// opset 22 only when it starts inside the input or its leading pad);
    /// `None` on overflow.
    fn outputs(&self, ceil: bool, legacy: bool) -> Option<i64> {
        let padded = self.size.checked_add(self.pads.0)?;
        let gap = padded.checked_add(self.pads.1)?.checked_sub(self.kernel)?;
        if legacy {
            // Exact ceil division (a negative gap included), as onnx's
            // convPoolShapeInference_opset19.
            let partial = i64::from(ceil && gap % self.stride > 0);
            return (gap / self.stride).checked_add(partial)?.checked_add(1);
        }
        let mut numerator = gap;
        if ceil {
            numerator = numerator.checked_add(self.stride - 1)?;
        }
        let mut len = (numerator / self.stride).checked_add(1)?;
        if ceil && (len - 1).checked_mul(self.stride)? >= padded {
            len -= 1;
        }
        Some(len)
    }
}

/// The pads `auto_pad` asks for (none for NOTSET and VALID).
fn auto_pads(n: &pb::NodeProto, x: &Shape, effective: &[i64], strides: &[i64]) -> Vec<i64> {
    let spatial = effective.len();
    let mut pads = vec![0; 2 * spatial];
    let mode = attr(n, "auto_pad").map(|a| &a.s[..]);
    let (Some(mode), false) = (mode, mode == Some(b"VALID".as_slice())) else {
        return pads;
    };
    for i in 0..spatial {
        let mut residual = 0;
        if strides[i] > 1 {
            match x[2 + i] {
                Dim::Value(v) if v >= 0 => residual = v % strides[i],
                _ => continue,
            }
        }
        let total = if residual == 0 {
            effective[i] - strides[i]
        } else {
            effective[i] - residual
        }
        .max(0);
        let (small, big) = (total >> 1, total - (total >> 1));
        match mode {
            b"SAME_UPPER" => (pads[i], pads[i + spatial]) = (small, big),
            b"SAME_LOWER" => (pads[i], pads[i + spatial]) = (big, small),
            _ => {}
        }
    }
    pads
}

#[cfg(test)]
mod tests {
    use super::Window;

    #[test]
    fn ceil_mode_counts_a_last_window_as_each_opset_does() {
        let w = |size, kernel, stride| Window {
            size,
            pads: (0, 0),
            kernel,
            stride,
        };
        // size 6, kernel 2, stride 3: windows at 0 and 3, and one at 6
        // starting past the input, which opset 22 drops.
        assert_eq!(w(6, 2, 3).outputs(true, true), Some(3));
        assert_eq!(w(6, 2, 3).outputs(true, false), Some(2));
        assert_eq!(w(6, 2, 3).outputs(false, true), Some(2));
        // A kernel larger than the input: onnx's exact ceil of a negative gap.
        assert_eq!(w(2, 6, 3).outputs(true, true), Some(0));
        let overflowing = Window {
            pads: (1, 0),
            ..w(i64::MAX, 1, 1)
        };
        assert_eq!(overflowing.outputs(true, false), None);
    }
}
