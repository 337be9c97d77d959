//! Dimensions and shapes as onnx's shape inference holds them, and its
//! rules for combining them: multidirectional broadcasting and merging an
//! inferred shape into a declared one.

use crate::pb;

/// One dimension: a number, a symbol, or nothing known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dim {
    Value(i64),
    Param(String),
    Unknown,
}

/// A shape, outermost dimension first.
pub(crate) type Shape = Vec<Dim>;

impl Dim {
    /// The symbol onnx compares when broadcasting: a param, or "" for a
    /// dimension with nothing known.
    fn symbol(&self) -> &str {
        match self {
            Dim::Param(p) => p,
            _ => "",
        }
    }

    pub(crate) fn from_proto(d: &pb::tensor_shape_proto::Dimension) -> Dim {
        use pb::tensor_shape_proto::dimension::Value;
        match &d.value {
            Some(Value::DimValue(v)) => Dim::Value(*v),
            Some(Value::DimParam(p)) if !p.is_empty() => Dim::Param(p.clone()),
            _ => Dim::Unknown,
        }
    }

    pub(crate) fn to_proto(&self) -> pb::tensor_shape_proto::Dimension {
        use pb::tensor_shape_proto::dimension::Value;
        pb::tensor_shape_proto::Dimension {
            value: match self {
                Dim::Value(v) => Some(Value::DimValue(*v)),
                Dim::Param(p) => Some(Value::DimParam(p.clone())),
                Dim::Unknown => None,
            },
            ..Default::default()
        }
    }
}

/// onnx's `multidirectionalBroadcastShapeInference`; `None` where the
/// numbers cannot broadcast (onnx fails the node).
pub(crate) fn broadcast(shapes: &[&Shape]) -> Option<Shape> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let mut value = 1i64;
        let mut symbolic: Option<&Dim> = None;
        let mut symbols = 0;
        for s in shapes {
            let Some(d) = (i + s.len()).checked_sub(rank).map(|j| &s[j]) else {
                continue;
            };
            match d {
                Dim::Value(v) if *v != 1 => {
                    if value != *v && value != 1 {
                        return None;
                    }
                    value = *v;
                }
                Dim::Value(_) => {}
                _ => match symbolic {
                    None => {
                        symbolic = Some(d);
                        symbols = 1;
                    }
                    Some(first) if first.symbol() != d.symbol() => symbols += 1,
                    Some(_) => {}
                },
            }
        }
        out.push(match (value, symbols, symbolic) {
            (v, _, _) if v != 1 => Dim::Value(v),
            (_, 0, _) => Dim::Value(1),
            (_, 1, Some(d)) => d.clone(),
            _ => Dim::Unknown,
        });
    }
    Some(out)
}

/// onnx's `mergeInDimensionInfo`: `source`'s number wins, else `target`'s,
/// else `target`'s symbol, else `source`'s.
pub(crate) fn merge_dim(source: &Dim, target: &mut Dim) {
    match (source, &*target) {
        (Dim::Value(v), _) => *target = Dim::Value(*v),
        (_, Dim::Value(_) | Dim::Param(_)) => {}
        (Dim::Param(p), Dim::Unknown) => *target = Dim::Param(p.clone()),
        (Dim::Unknown, Dim::Unknown) => {}
    }
}

/// The inferred and the declared shape contradict each other (their ranks,
/// or two numbers, differ): onnx fails the node.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Contradiction;

/// An inferred shape merged into a declared one (onnx's
/// `mergeShapesAndTypes`): the declared shape is taken where it has none;
/// on a contradiction the declared shape stays as it is.
pub(crate) fn merge_shape(
    inferred: Option<&Shape>,
    declared: &mut Option<Shape>,
) -> Result<(), Contradiction> {
    match (inferred, declared.as_mut()) {
        (Some(s), None) => *declared = Some(s.clone()),
        (Some(s), Some(d)) => {
            let numbers_differ = s
                .iter()
                .zip(d.iter())
                .any(|(a, b)| matches!((a, b), (Dim::Value(x), Dim::Value(y)) if x != y));
            if s.len() != d.len() || numbers_differ {
                return Err(Contradiction);
            }
            for (a, b) in s.iter().zip(d.iter_mut()) {
                merge_dim(a, b);
            }
        }
        (None, _) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Dim {
        Dim::Param(s.into())
    }

    #[test]
    fn broadcast_follows_onnx() {
        let a = vec![p("a"), p("b"), Dim::Value(384)];
        let b = vec![Dim::Value(384)];
        assert_eq!(broadcast(&[&a, &b]).unwrap(), a);
        // Two different symbols give a dimension with nothing known.
        let c = vec![p("x"), p("b"), Dim::Value(1)];
        assert_eq!(
            broadcast(&[&a, &c]).unwrap(),
            vec![Dim::Unknown, p("b"), Dim::Value(384)]
        );
        // A 1 against a symbol keeps the symbol.
        let d = vec![Dim::Value(1), Dim::Value(1), Dim::Value(384)];
        assert_eq!(broadcast(&[&a, &d]).unwrap(), a);
        assert!(broadcast(&[&vec![Dim::Value(2)], &vec![Dim::Value(3)]]).is_none());
        assert_eq!(broadcast(&[]).unwrap(), Vec::<Dim>::new());
    }

    #[test]
    fn merge_prefers_numbers_then_the_declared_symbol() {
        let mut declared = Some(vec![Dim::Unknown, p("d"), p("e")]);
        merge_shape(Some(&vec![p("s"), Dim::Value(4), p("t")]), &mut declared).unwrap();
        assert_eq!(
            declared.clone().unwrap(),
            vec![p("s"), Dim::Value(4), p("e")]
        );
        let mut none = None;
        merge_shape(Some(&vec![Dim::Value(2)]), &mut none).unwrap();
        assert_eq!(none.unwrap(), vec![Dim::Value(2)]);
        // Two numbers that differ, or another rank: the declared stays.
        let before = declared.clone();
        let other = vec![p("s"), Dim::Value(5), p("t")];
        assert_eq!(merge_shape(Some(&other), &mut declared), Err(Contradiction));
        let short = vec![Dim::Value(1)];
        assert_eq!(merge_shape(Some(&short), &mut declared), Err(Contradiction));
        assert_eq!(declared, before);
    }
}
