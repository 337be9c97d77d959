//! Policy: which initializers of a model get which formats, from the
//! config's rules and the graph's weight uses (MatMul / Gemm input B,
//! directly or through Identity / Transpose, honouring Gemm's transB).

use ctcache::dtype::DataType;
use ctcache::onnx::graph::{describe_filter, weight_uses, NotASource, WeightUses};
use ctcache::onnx::{Model, TensorRef};
use ctcache_kernels::{Orientation, Params};

use crate::config::PolicyRule;

/// One (initializer, format) pair the policy wants compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    pub initializer: String,
    pub format: String,
    pub params: Params,
}

/// What the policy decided for a model.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub wanted: Vec<Wanted>,
    /// Weight-like inputs that are not compiled-tensor sources in v1.
    pub not_sources: Vec<NotASource>,
    /// Initializers a rule matched but the packer refused (name, reason).
    pub refused: Vec<(String, String)>,
}

fn rule_matches(rule: &PolicyRule, t: &TensorRef, uses: &WeightUses) -> bool {
    // An empty list means FLOAT, as documented for the config key.
    let type_ok = if rule.data_types.is_empty() {
        t.data_type == DataType::FLOAT
    } else {
        rule.data_types
            .iter()
            .any(|n| DataType::from_name(n) == Some(t.data_type))
    };
    let rank_ok = rule.rank == 0 || t.dims.len() == rule.rank;
    type_ok && rank_ok && uses.admits(t, rule.min_elements, &rule.used_as)
}

/// The size and use filters an explicitly named format gets: those of the
/// policy's rules for it, else of every rule (a tensor passes when one
/// rule's filters admit it); none when the policy is empty.
pub fn admitted(rules: &[PolicyRule], format: &str, t: &TensorRef, uses: &WeightUses) -> bool {
    let own: Vec<&PolicyRule> = rules.iter().filter(|r| r.format == format).collect();
    let filters = if own.is_empty() {
        rules.iter().collect()
    } else {
        own
    };
    filters.is_empty()
        || filters
            .iter()
            .any(|r| uses.admits(t, r.min_elements, &r.used_as))
}

/// Those filters in words, for a selection that came out empty.
pub fn describe_filters(rules: &[PolicyRule], format: Option<&str>) -> String {
    let own: Vec<&PolicyRule> = rules
        .iter()
        .filter(|r| format.is_none_or(|f| r.format == f))
        .collect();
    let filters = if own.is_empty() {
        rules.iter().collect()
    } else {
        own
    };
    let mut words: Vec<String> = filters
        .iter()
        .map(|r| describe_filter(r.min_elements, &r.used_as))
        .collect();
    words.dedup();
    words.join("; or ")
}

impl Selection {
    /// Why nothing is wanted: the packers' refusals, else the filters no
    /// initializer passed (`filters`, in words).
    pub fn why_nothing(&self, filters: &str) -> String {
        const SHOWN: usize = 3;
        if !self.refused.is_empty() {
            let mut parts: Vec<String> = self
                .refused
                .iter()
                .take(SHOWN)
                .map(|(n, why)| format!("{n}: {why}"))
                .collect();
            if self.refused.len() > SHOWN {
                parts.push(format!("{} more", self.refused.len() - SHOWN));
            }
            return format!(
                "every initializer selected is refused ({})",
                parts.join("; ")
            );
        }
        format!(
            "no initializer passes the filters ({filters}); `ctcachectl resolve --all` lists them, \
             --initializer NAME with --format FORMAT packs one"
        )
    }
}

/// Applies `rules` to the model's top-level initializers.
pub fn select(model: &Model, rules: &[PolicyRule]) -> ctcache::Result<Selection> {
    let uses = weight_uses(model)?;
    let mut out = Selection {
        not_sources: uses.not_sources.clone(),
        ..Default::default()
    };
    for t in model.initializers()? {
        for rule in rules.iter().filter(|r| rule_matches(r, &t, &uses)) {
            let Some(packer) = ctcache_kernels::find(&rule.format) else {
                continue;
            };
            let params = match Params::parse(rule.params.iter().map(|(k, v)| format!("{k}={v}"))) {
                Ok(p) => p,
                Err(e) => {
                    out.refused.push((t.name.clone(), e.to_string()));
                    continue;
                }
            };
            // The uses this rule is for (all of them when it names none).
            let used: Vec<bool> = uses
                .of_kinds(&t.name, &rule.used_as)
                .map(|u| u.transposed)
                .collect();
            // Orientations the graph reads the weight in (none known, or a
            // format that does not care: as stored).
            let mut orientations = Vec::new();
            let orientation = packer.orientation();
            let kn = orientation != Orientation::AsStored;
            if !kn || used.is_empty() || used.contains(&false) {
                orientations.push(false);
            }
            if kn && used.contains(&true) {
                orientations.push(true);
            }
            for transposed in orientations {
                let mut params = params.clone();
                if transposed {
                    // A packer that reads W[N, K] itself takes it; one whose
                    // layout assumes W[K, N] cannot, so it says so.
                    if orientation != Orientation::KnOrTransposed {
                        out.refused.push((
                            t.name.clone(),
                            format!("{}: the graph uses this weight transposed (Gemm transB or Transpose); this format packs W[K, N] only", rule.format),
                        ));
                        continue;
                    }
                    params = params.with("transposed", "true");
                }
                match packer.check_source(t.data_type, &t.dims, &params) {
                    Ok(()) => out.wanted.push(Wanted {
                        initializer: t.name.clone(),
                        format: rule.format.clone(),
                        params,
                    }),
                    Err(e) => out.refused.push((t.name.clone(), e.to_string())),
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use ctcache::pb;
    use prost::Message;

    fn weight(name: &str, data_type: i32, dims: &[i64]) -> pb::TensorProto {
        let width = if data_type == 10 { 2 } else { 4 };
        let n: i64 = dims.iter().product();
        pb::TensorProto {
            name: name.into(),
            data_type,
            dims: dims.to_vec(),
            raw_data: vec![0u8; (n * width) as usize].into(),
            ..Default::default()
        }
    }

    /// `a` feeds MatMul B, `t` feeds Gemm B with transB = 1, `h` is FLOAT16.
    fn model() -> Model {
        let node = |op: &str, b: &str, y: &str, trans_b: bool| pb::NodeProto {
            op_type: op.into(),
            input: vec!["x".into(), b.into()],
            output: vec![y.into()],
            attribute: if trans_b {
                vec![pb::AttributeProto {
                    name: "transB".into(),
                    i: 1,
                    r#type: 2,
                    ..Default::default()
                }]
            } else {
                vec![]
            },
            ..Default::default()
        };
        let m = pb::ModelProto {
            ir_version: 9,
            graph: Some(pb::GraphProto {
                node: vec![
                    node("MatMul", "a", "y1", false),
                    node("Gemm", "t", "y2", true),
                    node("MatMul", "h", "y3", false),
                ],
                initializer: vec![
                    weight("a", 1, &[256, 256]),
                    weight("t", 1, &[256, 256]),
                    weight("h", 10, &[256, 256]),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        Model::from_bytes(Bytes::from(m.encode_to_vec()), ".").unwrap()
    }

    fn rule(format: &str, data_types: &[&str]) -> PolicyRule {
        PolicyRule {
            format: format.into(),
            params: Default::default(),
            data_types: data_types.iter().map(|s| s.to_string()).collect(),
            rank: 2,
            min_elements: 1,
            used_as: vec![],
        }
    }

    fn wanted(sel: &Selection) -> Vec<(String, String, Option<String>)> {
        let mut w: Vec<_> = sel
            .wanted
            .iter()
            .map(|w| {
                let t = w.params.get("transposed").map(str::to_string);
                (w.initializer.clone(), w.format.clone(), t)
            })
            .collect();
        w.sort();
        w
    }

    #[test]
    fn an_empty_type_list_means_float() {
        let sel = select(&model(), &[rule("cast.f16", &[])]).unwrap();
        let names: Vec<_> = wanted(&sel).into_iter().map(|w| w.0).collect();
        assert_eq!(names, ["a", "t"], "FLOAT16 `h` is not FLOAT");
        let sel = select(&model(), &[rule("ort.matmul_nbits", &["FLOAT16"])]).unwrap();
        let names: Vec<_> = wanted(&sel).into_iter().map(|w| w.0).collect();
        assert_eq!(names, ["h"]);
    }

    #[test]
    fn a_rule_for_gather_tables_takes_them_as_stored_and_only_them() {
        // E: a Gather's table, also read transposed by a Gemm; W: a MatMul's.
        let mut gemm = pb::NodeProto {
            op_type: "Gemm".into(),
            input: vec!["x".into(), "E".into()],
            output: vec!["logits".into()],
            ..Default::default()
        };
        gemm.attribute.push(pb::AttributeProto {
            name: "transB".into(),
            i: 1,
            r#type: 2,
            ..Default::default()
        });
        let node = |op: &str, inputs: [&str; 2], y: &str| pb::NodeProto {
            op_type: op.into(),
            input: inputs.map(String::from).to_vec(),
            output: vec![y.into()],
            ..Default::default()
        };
        let m = pb::ModelProto {
            ir_version: 9,
            graph: Some(pb::GraphProto {
                node: vec![
                    node("Gather", ["E", "ids"], "e"),
                    node("MatMul", ["e", "W"], "h"),
                    gemm,
                ],
                initializer: vec![weight("E", 1, &[300, 256]), weight("W", 1, &[256, 256])],
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = Model::from_bytes(Bytes::from(m.encode_to_vec()), ".").unwrap();
        let mut tables = rule("ort.quantize_dynamic", &[]);
        tables.used_as = vec!["Gather.data".into()];
        tables.params = [("weight_type", "uint8"), ("symmetric", "false")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into_iter()
            .collect();
        let mut matrices = rule("ort.matmul_nbits", &[]);
        matrices.used_as = vec!["MatMul.B".into(), "Gemm.B".into()];
        let sel = select(&m, &[tables, matrices]).unwrap();
        let s = |v: &str| v.to_string();
        // The table once as stored for the Gather rule; for the Gemm only
        // transposed (its Gather use is not the nbits rule's).
        assert_eq!(
            wanted(&sel),
            [
                (s("E"), s("ort.matmul_nbits"), Some(s("true"))),
                (s("E"), s("ort.quantize_dynamic"), None),
                (s("W"), s("ort.matmul_nbits"), None),
            ]
        );
    }

    #[test]
    fn a_transposed_use_gets_transposed_nbits_and_no_kn_panels() {
        let rules = [
            rule("ort.matmul_nbits", &[]),
            rule("gemm.pack_b.f32", &[]),
            rule("cast.f16", &[]),
        ];
        let sel = select(&model(), &rules).unwrap();
        let s = |v: &str| v.to_string();
        assert_eq!(
            wanted(&sel),
            [
                (s("a"), s("cast.f16"), None),
                (s("a"), s("gemm.pack_b.f32"), None),
                (s("a"), s("ort.matmul_nbits"), None),
                (s("t"), s("cast.f16"), None),
                (s("t"), s("ort.matmul_nbits"), Some(s("true"))),
            ]
        );
        let (name, why) = &sel.refused[0];
        assert_eq!(name, "t");
        assert!(
            why.contains("gemm.pack_b.f32") && why.contains("transposed"),
            "{why}"
        );
    }
}
