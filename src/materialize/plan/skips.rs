//! What a plan leaves and why: the nodes left as they are, grouped by
//! reason for reports, and the sentence that says why nothing can be
//! materialized (with the int8 op types that would take the model).

use super::Plan;

/// A MatMul / Gemm left as it is, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The node's name, or `#index` when unnamed.
    pub node: String,
    /// `MatMul` or `Gemm`.
    pub op_type: String,
    /// The rule, worded the same for every node it stops ("B is not a
    /// constant"), so reports can count nodes per reason.
    pub reason: String,
    /// This node's case: which input, which value.
    pub detail: String,
}

/// Nodes skipped for one reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkipGroup<'a> {
    /// `MatMul` or `Gemm`.
    pub op_type: &'a str,
    /// The shared reason, as in [`Skipped::reason`].
    pub reason: &'a str,
    /// How many nodes it stopped.
    pub nodes: usize,
}

impl std::fmt::Display for SkipGroup<'_> {
    /// `6 MatMul left as they are: B is computed, not a weight`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} left as they are: {}",
            self.nodes, self.op_type, self.reason
        )
    }
}

/// (op type, reason) pairs counted, in first-seen order.
pub fn group_skips<'a>(skips: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<SkipGroup<'a>> {
    let mut groups: Vec<SkipGroup<'a>> = Vec::new();
    for (op_type, reason) in skips {
        match groups
            .iter_mut()
            .find(|g| g.op_type == op_type && g.reason == reason)
        {
            Some(g) => g.nodes += 1,
            None => groups.push(SkipGroup {
                op_type,
                reason,
                nodes: 1,
            }),
        }
    }
    groups
}

impl Plan {
    /// Why nothing can be materialized, when no node is a target: the
    /// skipped nodes counted per reason, each with its first node's case;
    /// or that there is no node of the op types the recipe rewrites.
    pub fn why_nothing(&self) -> Option<String> {
        if !self.targets.is_empty() || self.fp16.is_some() {
            return None;
        }
        if self.skipped.is_empty() {
            return Some(format!(
                "the model has no node of the op types rewritten ({}){}",
                self.op_types.join(", "),
                self.int8_hint()
            ));
        }
        let groups = group_skips(
            self.skipped
                .iter()
                .map(|s| (s.op_type.as_str(), s.reason.as_str())),
        );
        let lines: Vec<String> = groups
            .iter()
            .map(|g| {
                let first = self
                    .skipped
                    .iter()
                    .find(|s| s.op_type == g.op_type && s.reason == g.reason)
                    .expect("grouped from these");
                let which = if g.nodes == 1 { "" } else { "first: " };
                format!(
                    "{g} ({which}{} {}: {})",
                    first.op_type, first.node, first.detail
                )
            })
            .collect();
        Some(format!("{}{}", lines.join("; "), self.int8_hint()))
    }

    /// "; the int8 target quantizes its 83 Conv with --op-types Conv".
    fn int8_hint(&self) -> String {
        if self.int8_elsewhere.is_empty() {
            return String::new();
        }
        let nodes: Vec<String> = self
            .int8_elsewhere
            .iter()
            .map(|(op, n)| format!("{n} {op}"))
            .collect();
        let ops: Vec<&str> = self
            .int8_elsewhere
            .iter()
            .map(|(op, _)| op.as_str())
            .collect();
        format!(
            "; --target onnxruntime-int8 --op-types {} quantizes its {}",
            ops.join(","),
            nodes.join(" and ")
        )
    }
}
