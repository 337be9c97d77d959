//! Weight-use analysis of the top-level graph: which initializers feed the B
//! input of MatMul / Gemm, a Gather's table or a Conv's W (directly or
//! through Identity / Transpose), whether that use sees them transposed, and
//! which MatMul / Gemm weight inputs are not compiled-tensor sources in v1
//! (Constant nodes, Cast / Mul chains).

use std::collections::{HashMap, HashSet};

use crate::error::Result;
use crate::onnx::{Model, TensorRef};
use crate::pb;

/// The operator input an initializer feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UseSite {
    /// Input B of a `MatMul`.
    MatMulB,
    /// Input B of a `Gemm`.
    GemmB,
    /// Input data (the table) of a `Gather`.
    GatherData,
    /// Input W of a `Conv`.
    ConvW,
}

impl UseSite {
    /// The name used in policies and reports: `MatMul.B`, `Gemm.B`,
    /// `Gather.data` or `Conv.W`.
    pub fn name(self) -> &'static str {
        match self {
            UseSite::MatMulB => "MatMul.B",
            UseSite::GemmB => "Gemm.B",
            UseSite::GatherData => "Gather.data",
            UseSite::ConvW => "Conv.W",
        }
    }

    /// The site's consumer: node `n`'s op type and the input index the
    /// weight feeds, when `n` is one.
    fn of(n: &pb::NodeProto) -> Option<(UseSite, usize)> {
        if !is_default_domain(n) {
            return None;
        }
        Some(match n.op_type.as_str() {
            "MatMul" => (UseSite::MatMulB, 1),
            "Gemm" => (UseSite::GemmB, 1),
            "Gather" => (UseSite::GatherData, 0),
            "Conv" => (UseSite::ConvW, 1),
            _ => return None,
        })
    }

    /// Whether a weight computed in the graph or held in a Constant at this
    /// site is worth reporting as not compiled (the matrix weights; tables
    /// and convolution weights are found when they are initializers).
    fn reports_not_sources(self) -> bool {
        matches!(self, UseSite::MatMulB | UseSite::GemmB)
    }
}

/// One use of an initializer as a weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightUse {
    /// The initializer's name.
    pub initializer: String,
    /// The operator input it feeds.
    pub site: UseSite,
    /// Name of the consuming node (or its index when unnamed).
    pub node: String,
    /// True when the consumer sees the initializer transposed (a Transpose
    /// in between, or Gemm with transB = 1): the logical B is `W^T`.
    pub transposed: bool,
    /// Ops passed through on the way (Identity, Transpose).
    pub via: Vec<String>,
}

/// A weight-like input that ctcache cannot compile in v1, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotASource {
    /// The input's name.
    pub name: String,
    /// Why it cannot be compiled (not an initializer, segmented, ...).
    pub reason: String,
}

/// The analysis result.
#[derive(Debug, Clone, Default)]
pub struct WeightUses {
    /// Every weight use found, in graph order.
    pub uses: Vec<WeightUse>,
    /// Weight-like inputs that cannot be compiled.
    pub not_sources: Vec<NotASource>,
}

impl WeightUses {
    /// Uses of one initializer.
    pub fn of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a WeightUse> + 'a {
        self.uses.iter().filter(move |u| u.initializer == name)
    }

    /// Uses of one initializer that a rule's `used_as` names
    /// (`UseSite::name`: `MatMul.B`, `Gemm.B`, ...); all of them when it is
    /// empty.
    pub fn of_kinds<'a, S: AsRef<str>>(
        &'a self,
        name: &'a str,
        used_as: &'a [S],
    ) -> impl Iterator<Item = &'a WeightUse> + 'a {
        self.of(name).filter(move |u| {
            used_as.is_empty() || used_as.iter().any(|w| w.as_ref() == u.site.name())
        })
    }

    /// Whether `t` passes a packing rule's size and use filters: at least
    /// `min_elements` elements and, unless `used_as` is empty, one of those
    /// uses.
    pub fn admits<S: AsRef<str>>(&self, t: &TensorRef, min_elements: u64, used_as: &[S]) -> bool {
        t.elements >= min_elements
            && (used_as.is_empty() || self.of_kinds(&t.name, used_as).next().is_some())
    }
}

/// The size and use filters of the default packing rules (the daemon's
/// default policy, and `ctcachectl embed` packing without a daemon).
pub const DEFAULT_MIN_ELEMENTS: u64 = 65_536;
/// The uses the default packing rules admit.
pub const DEFAULT_USED_AS: [&str; 2] = ["MatMul.B", "Gemm.B"];

/// A rule's size and use filters in words: `at least 65536 elements, used
/// as MatMul.B or Gemm.B`.
pub fn describe_filter<S: AsRef<str>>(min_elements: u64, used_as: &[S]) -> String {
    let uses: Vec<&str> = used_as.iter().map(AsRef::as_ref).collect();
    match uses.as_slice() {
        [] => format!("at least {min_elements} elements"),
        _ => format!(
            "at least {min_elements} elements, used as {}",
            uses.join(" or ")
        ),
    }
}

/// What the daemon and `ctcachectl` say when a model has nothing to pack.
pub fn nothing_to_pack(model: &std::path::Path, why: &str) -> String {
    format!("{}: nothing to pack: {why}", model.display())
}

/// A node's attribute by name.
pub(crate) fn attr<'a>(n: &'a pb::NodeProto, name: &str) -> Option<&'a pb::AttributeProto> {
    n.attribute.iter().find(|a| a.name == name)
}

fn attr_int(n: &pb::NodeProto, name: &str) -> Option<i64> {
    attr(n, name).map(|a| a.i)
}

/// A node's name for messages: its name, or `#index` when it has none.
pub(crate) fn node_label(n: &pb::NodeProto, index: usize) -> String {
    if n.name.is_empty() {
        format!("#{index}")
    } else {
        n.name.clone()
    }
}

/// The node is in the standard ONNX domain.
pub(crate) fn is_default_domain(n: &pb::NodeProto) -> bool {
    n.domain.is_empty() || n.domain == "ai.onnx"
}

/// What the walk back from a weight input needs of the node producing a
/// value: kept per output instead of the whole node.
#[derive(Clone)]
enum Producer {
    /// Identity or Transpose (default domain; `swaps` unless a perm other
    /// than `[1, 0]`): passed through to its first input.
    PassThrough {
        op: &'static str,
        first_input: Option<String>,
        swaps: bool,
    },
    /// A Constant node: a weight that is not an initializer.
    Constant,
    /// Cast, Mul, DequantizeLinear, Reshape: a weight computed in the graph.
    Computed(&'static str),
}

impl Producer {
    fn of(n: &pb::NodeProto) -> Option<Producer> {
        let default = is_default_domain(n);
        Some(match n.op_type.as_str() {
            op @ ("Identity" | "Transpose") if default => {
                let perm = attr(n, "perm").map(|a| a.ints.as_slice());
                Producer::PassThrough {
                    op: if op == "Identity" {
                        "Identity"
                    } else {
                        "Transpose"
                    },
                    first_input: n.input.first().cloned(),
                    swaps: op == "Transpose" && perm.is_none_or(|p| p == [1, 0]),
                }
            }
            "Constant" => Producer::Constant,
            "Cast" => Producer::Computed("Cast"),
            "Mul" => Producer::Computed("Mul"),
            "DequantizeLinear" => Producer::Computed("DequantizeLinear"),
            "Reshape" => Producer::Computed("Reshape"),
            _ => return None,
        })
    }
}

/// A node's weight input (a [`UseSite`]), as the walk starts from it.
struct Consumer {
    node: String,
    site: UseSite,
    input: String,
    transposed: bool,
}

/// Analyses the model's top-level graph. Nodes are decoded one at a time;
/// only the weight inputs and the producers a walk can pass are kept.
pub fn weight_uses(model: &Model) -> Result<WeightUses> {
    let mut scan = NodeScan {
        initializers: model.initializers()?.into_iter().map(|t| t.name).collect(),
        ..NodeScan::default()
    };
    for (idx, n) in model.nodes_one_by_one()?.enumerate() {
        scan.note(idx, &n?);
    }
    let mut out = WeightUses::default();
    for c in std::mem::take(&mut scan.consumers) {
        out.uses.extend(scan.trace(c, &mut out.not_sources));
    }
    out.not_sources.extend(scan.in_subgraphs);
    Ok(out)
}

/// What the walk back from a weight input needs of the graph, gathered
/// node by node.
#[derive(Default)]
struct NodeScan {
    /// The top-level initializers' names.
    initializers: HashSet<String>,
    /// Each output's producer, when the walk can pass it.
    producers: HashMap<String, Producer>,
    /// The weight inputs, in node order.
    consumers: Vec<Consumer>,
    /// Initializers of subgraphs, which are not sources.
    in_subgraphs: Vec<NotASource>,
}

impl NodeScan {
    /// Keeps what node `n` (the `idx`th) tells the walk.
    fn note(&mut self, idx: usize, n: &pb::NodeProto) {
        // The last node naming an output is its producer; one the walk
        // cannot pass stops it, as no producer does.
        let producer = Producer::of(n);
        for o in &n.output {
            match &producer {
                Some(p) => {
                    self.producers.insert(o.clone(), p.clone());
                }
                None => {
                    self.producers.remove(o);
                }
            }
        }
        let consumer = UseSite::of(n).and_then(|(site, i)| Some((site, n.input.get(i)?)));
        if let Some((site, input)) = consumer.filter(|(_, input)| !input.is_empty()) {
            self.consumers.push(Consumer {
                node: node_label(n, idx),
                site,
                input: input.clone(),
                transposed: site == UseSite::GemmB && attr_int(n, "transB") == Some(1),
            });
        }
        // Weights inside subgraphs (If / Loop / Scan bodies) are not sources in v1.
        for a in &n.attribute {
            for g in a.g.iter().chain(a.graphs.iter()) {
                for t in &g.initializer {
                    self.in_subgraphs.push(NotASource {
                        name: t.name.clone(),
                        reason: format!("initializer of a subgraph of node {:?} (v1 compiles top-level initializers only)", n.name),
                    });
                }
            }
        }
    }

    /// Walks back from weight input `c` through value-preserving ops to an
    /// initializer: its use, if found; a Constant or computed weight met on
    /// the way goes to `not_sources`.
    fn trace(&self, c: Consumer, not_sources: &mut Vec<NotASource>) -> Option<WeightUse> {
        let mut transposed = c.transposed;
        let mut via = Vec::new();
        let mut name = c.input.as_str();
        for _ in 0..8 {
            if self.initializers.contains(name) {
                return Some(WeightUse {
                    initializer: name.to_string(),
                    site: c.site,
                    node: c.node,
                    transposed,
                    via,
                });
            }
            let p = self.producers.get(name)?;
            match p {
                Producer::PassThrough {
                    op,
                    first_input,
                    swaps,
                } => {
                    if *op == "Transpose" {
                        // Only a 2-D swap (perm absent or [1, 0]) keeps the weight 2-D transposed.
                        if !swaps {
                            return None;
                        }
                        transposed = !transposed;
                    }
                    via.push(op.to_string());
                    name = first_input.as_deref()?;
                }
                Producer::Constant | Producer::Computed(_) if !c.site.reports_not_sources() => {
                    return None;
                }
                Producer::Constant => {
                    not_sources.push(NotASource {
                        name: name.to_string(),
                        reason: format!("{} input is a Constant node, not an initializer (v1 compiles initializers only)", c.site.name()),
                    });
                    return None;
                }
                Producer::Computed(op) => {
                    not_sources.push(NotASource {
                        name: name.to_string(),
                        reason: format!("{} input is computed by {op} (dequantize-in-graph); v1 compiles initializers used directly", c.site.name()),
                    });
                    return None;
                }
            }
        }
        None
    }
}
