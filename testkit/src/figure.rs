//! Performance figures as machine-readable lines, one per figure:
//!
//! ```text
//! RESULT name=store.gc value=1.42 unit=s target=value<2 label="gc of 10% of 100000 entries"
//! RESULT name=digest.b3sum value=3.1 unit=GB/s anchor=2.9 ratio=1.069 target=ratio>=1.0 label="..."
//! ```
//!
//! A bench prints them beside its prose; `bench/all.sh` collects them into
//! the performance table (bench/results.py parses them and judges the
//! target). `anchor` is the reference measured in the same run and `ratio`
//! the figure against it as the bench states its target (value / anchor for
//! a throughput, anchor / value for a time, value / anchor for a size
//! bound); `target` bounds `value` or `ratio`.

use std::fmt;

/// One figure; print it with `println!("{figure}")` or [`Figure::print`].
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    name: String,
    label: String,
    value: f64,
    unit: String,
    anchor: Option<(f64, f64)>,
    target: Option<String>,
}

/// What a target bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    Value,
    Ratio,
}

impl Figure {
    /// A figure `name` (dotted id, no spaces) of `value` `unit`.
    pub fn new(name: &str, label: &str, value: f64, unit: &str) -> Figure {
        Figure {
            name: name.into(),
            label: label.into(),
            value,
            unit: unit.into(),
            anchor: None,
            target: None,
        }
    }

    /// The anchor measured in the same run and the figure's ratio to it
    /// (as the target reads it: for times, anchor / value).
    pub fn anchor(mut self, anchor: f64, ratio: f64) -> Figure {
        self.anchor = Some((anchor, ratio));
        self
    }

    /// A target on the value or the ratio: `op` is one of `>=`, `>`, `<=`, `<`.
    pub fn target(mut self, on: On, op: &str, bound: f64) -> Figure {
        assert!(
            matches!(op, ">=" | ">" | "<=" | "<"),
            "target operator {op:?}"
        );
        let on = match on {
            On::Value => "value",
            On::Ratio => "ratio",
        };
        self.target = Some(format!("{on}{op}{bound}"));
        self
    }

    pub fn print(&self) {
        println!("{self}");
    }
}

/// Numbers in full precision but without float noise in the last digits.
fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{}", (v * 1e6).round() / 1e6)
    } else {
        "nan".into()
    }
}

impl fmt::Display for Figure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = |s: &str| s.replace(char::is_whitespace, "_");
        write!(
            f,
            "RESULT name={} value={} unit={}",
            word(&self.name),
            num(self.value),
            word(&self.unit)
        )?;
        if let Some((anchor, ratio)) = self.anchor {
            write!(f, " anchor={} ratio={}", num(anchor), num(ratio))?;
        }
        if let Some(t) = &self.target {
            write!(f, " target={t}")?;
        }
        write!(f, " label=\"{}\"", self.label.replace(['"', '\n'], "'"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_parsable_line() {
        let f = Figure::new("digest.b3sum", "digest \"vs\" b3sum\nx", 3.1234567, "GB/s")
            .anchor(2.5, 3.1234567 / 2.5)
            .target(On::Ratio, ">=", 1.0);
        assert_eq!(
            f.to_string(),
            "RESULT name=digest.b3sum value=3.123457 unit=GB/s anchor=2.5 ratio=1.249383 \
             target=ratio>=1 label=\"digest 'vs' b3sum'x\""
        );
        let g = Figure::new("store gc", "gc", f64::NAN, "s").target(On::Value, "<", 2.0);
        assert_eq!(
            g.to_string(),
            "RESULT name=store_gc value=nan unit=s target=value<2 label=\"gc\""
        );
    }

    #[test]
    #[should_panic(expected = "target operator")]
    fn refuses_an_unknown_operator() {
        let _ = Figure::new("a", "a", 1.0, "s").target(On::Value, "==", 1.0);
    }
}
