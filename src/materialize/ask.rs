//! The one rule for what a materialize request may ask, shared by the
//! daemon (RPC fields) and ctcachectl (flags): each target takes its own
//! settings and refuses another's, naming it; unset int4 settings come from
//! the defaults the caller gives (the daemon's policy, else the packer's).

use super::{
    Fp16Settings, Int8Settings, Recipe, Settings, TARGETS, TARGET_ORT_FP16, TARGET_ORT_INT4,
    TARGET_ORT_INT8,
};

/// A target's setting, as a request can name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// int4: bits per weight.
    Bits,
    /// int4: weights per scale.
    BlockSize,
    /// int4: zero points or not.
    Symmetric,
    /// int4: MatMulNBits `accuracy_level`.
    AccuracyLevel,
    /// int8: `int8` or `uint8`.
    WeightType,
    /// int8: a scale per output column.
    PerChannel,
    /// int8: 7-bit ranges.
    ReduceRange,
    /// int8: `op_types_to_quantize`.
    OpTypes,
    /// fp16: the converter's `op_block_list`.
    OpBlockList,
}

impl Setting {
    /// The target whose setting it is.
    pub fn target(self) -> &'static str {
        match self {
            Setting::Bits | Setting::BlockSize | Setting::Symmetric | Setting::AccuracyLevel => {
                TARGET_ORT_INT4
            }
            Setting::OpBlockList => TARGET_ORT_FP16,
            _ => TARGET_ORT_INT8,
        }
    }
}

impl Setting {
    /// Why this setting is refused for `asked`, in the caller's words:
    /// `name` is how it names the setting, `quote` how it names a target
    /// (`onnxruntime-fp16`, `--target onnxruntime-fp16`).
    pub fn refused_for(self, asked: &str, name: &str, quote: impl Fn(&str) -> String) -> String {
        if asked == TARGET_ORT_FP16 {
            format!("{name} is not a setting of {}", quote(asked))
        } else {
            format!(
                "{name} is a setting of {}, not of {}",
                quote(self.target()),
                quote(asked)
            )
        }
    }
}

/// A materialize request's target and settings (unset: `None`, `false`,
/// `0`, empty).
#[derive(Debug, Clone, Default)]
pub struct Ask {
    /// The target; empty is `onnxruntime-int4`.
    pub target: String,
    /// int4 settings.
    pub bits: Option<u32>,
    /// int4 settings.
    pub block_size: Option<u32>,
    /// int4 settings.
    pub symmetric: Option<bool>,
    /// int4 settings (0 leaves the attribute out).
    pub accuracy_level: i64,
    /// int8 settings.
    pub weight_type: Option<String>,
    /// int8 settings.
    pub per_channel: bool,
    /// int8 settings.
    pub reduce_range: bool,
    /// int8 settings (empty: MatMul).
    pub op_types: Vec<String>,
    /// fp16 settings (`None`: the converter's default list).
    pub op_block_list: Option<Vec<String>>,
}

/// Why a request's recipe is refused.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// A setting of another target than the one asked.
    #[error("{setting:?} is a setting of {}, not of {target}", setting.target())]
    Misplaced {
        /// The setting.
        setting: Setting,
        /// The target asked.
        target: &'static str,
    },
    /// No such target.
    #[error("unknown target {name:?} (known: {})", TARGETS.join(", "))]
    UnknownTarget {
        /// The target asked.
        name: String,
    },
    /// A setting's value the target cannot take.
    #[error(transparent)]
    Invalid(#[from] crate::Error),
}

impl Ask {
    /// The settings this request names, in a fixed order.
    fn named(&self) -> Vec<Setting> {
        [
            (Setting::Bits, self.bits.is_some()),
            (Setting::BlockSize, self.block_size.is_some()),
            (Setting::Symmetric, self.symmetric.is_some()),
            (Setting::AccuracyLevel, self.accuracy_level != 0),
            (Setting::WeightType, self.weight_type.is_some()),
            (Setting::PerChannel, self.per_channel),
            (Setting::ReduceRange, self.reduce_range),
            (Setting::OpTypes, !self.op_types.is_empty()),
            (Setting::OpBlockList, self.op_block_list.is_some()),
        ]
        .into_iter()
        .filter_map(|(s, set)| set.then_some(s))
        .collect()
    }

    /// The recipe asked for: int4 settings over `int4_defaults`, fp16 with
    /// the clamped cast `fp16_convert` (the kernels').
    pub fn recipe(
        &self,
        int4_defaults: Settings,
        fp16_convert: fn(&[u8]) -> Vec<u8>,
    ) -> Result<Recipe, AskError> {
        let target = match self.target.as_str() {
            "" | TARGET_ORT_INT4 => TARGET_ORT_INT4,
            TARGET_ORT_INT8 => TARGET_ORT_INT8,
            TARGET_ORT_FP16 => TARGET_ORT_FP16,
            other => return Err(AskError::UnknownTarget { name: other.into() }),
        };
        if let Some(setting) = self.named().into_iter().find(|s| s.target() != target) {
            return Err(AskError::Misplaced { setting, target });
        }
        let recipe = match target {
            TARGET_ORT_INT4 => Recipe::Nbits(Settings {
                bits: self.bits.unwrap_or(int4_defaults.bits),
                block_size: self.block_size.unwrap_or(int4_defaults.block_size),
                symmetric: self.symmetric.unwrap_or(int4_defaults.symmetric),
                accuracy_level: self.accuracy_level,
            }),
            TARGET_ORT_INT8 => {
                let mut s = Int8Settings::default();
                if let Some(w) = &self.weight_type {
                    s.signed = Int8Settings::parse_weight_type(w)?;
                }
                s.per_channel = self.per_channel;
                s.reduce_range = self.reduce_range;
                if !self.op_types.is_empty() {
                    s.op_types = self.op_types.clone();
                }
                Recipe::Int8(s)
            }
            _ => Recipe::Fp16(Fp16Settings {
                convert: fp16_convert,
                op_block_list: self.op_block_list.clone(),
            }),
        };
        recipe.validate()?;
        Ok(recipe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &[u8]) -> Vec<u8> {
        Vec::new()
    }

    #[test]
    fn each_target_takes_its_settings_and_names_anothers() {
        let defaults = Settings {
            bits: 8,
            ..Settings::default()
        };
        let int4 = Ask {
            block_size: Some(64),
            ..Ask::default()
        };
        let Recipe::Nbits(s) = int4.recipe(defaults, none).unwrap() else {
            panic!("int4");
        };
        assert_eq!((s.bits, s.block_size), (8, 64));
        let misplaced = Ask {
            target: TARGET_ORT_FP16.into(),
            per_channel: true,
            ..Ask::default()
        };
        let e = misplaced.recipe(defaults, none).unwrap_err();
        assert!(matches!(
            e,
            AskError::Misplaced {
                setting: Setting::PerChannel,
                target: TARGET_ORT_FP16
            }
        ));
        let int8 = Ask {
            target: TARGET_ORT_INT8.into(),
            bits: Some(4),
            ..Ask::default()
        };
        assert!(matches!(
            int8.recipe(defaults, none).unwrap_err(),
            AskError::Misplaced {
                setting: Setting::Bits,
                ..
            }
        ));
        let keep = Ask {
            op_block_list: Some(vec!["Resize".into()]),
            ..Ask::default()
        };
        assert!(matches!(
            keep.recipe(defaults, none).unwrap_err(),
            AskError::Misplaced {
                setting: Setting::OpBlockList,
                target: TARGET_ORT_INT4
            }
        ));
        let fp16 = Ask {
            target: TARGET_ORT_FP16.into(),
            ..keep
        };
        let Recipe::Fp16(s) = fp16.recipe(defaults, none).unwrap() else {
            panic!("fp16");
        };
        assert!(s.keeps("Resize") && !s.keeps("TopK"));
        let bad = Ask {
            block_size: Some(48),
            ..Ask::default()
        };
        assert!(matches!(
            bad.recipe(defaults, none).unwrap_err(),
            AskError::Invalid(_)
        ));
        let unknown = Ask {
            target: "tensorrt-fp8".into(),
            ..Ask::default()
        };
        assert!(unknown
            .recipe(defaults, none)
            .unwrap_err()
            .to_string()
            .contains("unknown target \"tensorrt-fp8\""));
    }
}
