//! Fresh names for what a materialize adds: names that no initializer,
//! graph input or value defined in the graph (subgraphs included) takes.

use std::collections::HashSet;

use super::weight::Source;
use crate::error::Result;
use crate::materialize::plan::graph_value_names;
use crate::onnx::fields::GRAPH_INPUT;
use crate::pb;

/// Names not yet taken in the graph.
pub(super) struct Names(HashSet<String>);

impl Names {
    /// The names the source graph leaves free.
    pub(super) fn free_in(src: &Source<'_>) -> Result<Names> {
        let mut taken: HashSet<String> = src.initializers.iter().map(|t| t.name.clone()).collect();
        taken.extend(graph_value_names(src.model, GRAPH_INPUT)?);
        defined_names(&src.top_nodes, &mut taken);
        Ok(Names(taken))
    }

    /// `base`, or `base_<i>` for the first `i` free, now taken.
    pub(super) fn fresh(&mut self, base: String) -> String {
        let mut name = base.clone();
        let mut i = 1;
        while self.0.contains(&name) {
            name = format!("{base}_{i}");
            i += 1;
        }
        self.0.insert(name.clone());
        name
    }
}

/// Every value a node list (and its subgraphs) defines or declares.
fn defined_names(nodes: &[pb::NodeProto], out: &mut HashSet<String>) {
    for n in nodes {
        out.extend(n.output.iter().cloned());
        for a in &n.attribute {
            for g in a.g.iter().chain(a.graphs.iter()) {
                out.extend(g.input.iter().map(|v| v.name.clone()));
                out.extend(g.initializer.iter().map(|t| t.name.clone()));
                defined_names(&g.node, out);
            }
        }
    }
}
