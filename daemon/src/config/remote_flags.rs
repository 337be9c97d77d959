//! The `--remote-*` flags, made from `[remote]`'s one declaration
//! ([`RemoteConfig`]: its fields, doc comments and defaults, read through
//! its schema). A new key is one field there; its flag, the flag's help and
//! the default that help shows follow.

use clap::{Arg, ArgAction, ArgMatches, Command};
use ctcache_remote::config::RemoteConfig;
use serde_json::Value as Json;

use super::ConfigError;

/// The `--remote-*` flags given: each replaces its `[remote]` key, and any
/// of them turns the section on when the file has none.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RemoteFlags {
    given: Vec<(String, toml::Value)>,
}

/// One `[remote]` key as its flag sees it.
struct Key {
    name: String,
    kind: Kind,
    help: String,
}

/// What a flag's value is, from the key's type.
enum Kind {
    Bool,
    Integer,
    Number,
    Text,
    Choice(Vec<String>),
    /// A list of text: a repeatable flag named in the singular.
    List,
}

/// The section's keys, in declaration order.
fn keys() -> Vec<Key> {
    let schema = schemars::schema_for!(RemoteConfig);
    let root = schema.as_value();
    let Some(props) = root.get("properties").and_then(Json::as_object) else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(name, prop)| Key {
            name: name.clone(),
            kind: kind(root, prop),
            help: help(prop),
        })
        .collect()
}

fn kind(root: &Json, prop: &Json) -> Kind {
    let resolved = prop
        .get("$ref")
        .and_then(Json::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|name| root.get("$defs")?.get(name))
        .unwrap_or(prop);
    if let Some(choices) = choices(resolved) {
        return Kind::Choice(choices);
    }
    // An optional key's type is `[type, "null"]`.
    let types: Vec<&str> = match resolved.get("type") {
        Some(Json::String(t)) => vec![t.as_str()],
        Some(Json::Array(ts)) => ts.iter().filter_map(Json::as_str).collect(),
        _ => Vec::new(),
    };
    match types.iter().find(|t| **t != "null") {
        Some(&"boolean") => Kind::Bool,
        Some(&"integer") => Kind::Integer,
        Some(&"number") => Kind::Number,
        Some(&"array") => Kind::List,
        _ => Kind::Text,
    }
}

/// An enum's names: `enum: [...]`, or `oneOf` of `const`s when its
/// variants have doc comments.
fn choices(schema: &Json) -> Option<Vec<String>> {
    let names = |vs: &Vec<Json>| -> Vec<String> {
        vs.iter()
            .filter_map(|v| v.get("const").unwrap_or(v).as_str().map(String::from))
            .collect()
    };
    if let Some(Json::Array(vs)) = schema.get("enum") {
        return Some(names(vs));
    }
    match schema.get("oneOf") {
        Some(Json::Array(vs)) => Some(names(vs)),
        _ => None,
    }
}

/// The key's doc comment on one line, and its default unless empty.
fn help(prop: &Json) -> String {
    let doc = prop.get("description").and_then(Json::as_str).unwrap_or("");
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut help = doc.trim_end_matches('.').to_string();
    if prop.get("type").and_then(Json::as_str) == Some("array") {
        help.push_str(" (repeatable; replaces the list)");
    }
    let default = match prop.get("default") {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) if s.is_empty() => None,
        Some(Json::Array(a)) if a.is_empty() => None,
        Some(Json::String(s)) => Some(s.clone()),
        Some(v) => Some(v.to_string()),
    };
    if let Some(d) = default {
        help.push_str(&format!(" (default: {d})"));
    }
    help + "."
}

impl Key {
    fn flag(&self) -> String {
        let long = format!("remote-{}", self.name.replace('_', "-"));
        match self.kind {
            Kind::List => long.strip_suffix('s').unwrap_or(&long).to_string(),
            _ => long,
        }
    }

    fn arg(&self) -> Arg {
        let flag = self.flag();
        let value_name = flag["remote-".len()..].replace('-', "_").to_uppercase();
        let arg = Arg::new(self.name.clone())
            .long(flag)
            .value_name(value_name)
            .help(self.help.clone());
        match &self.kind {
            Kind::Bool => arg.value_parser(clap::value_parser!(bool)),
            // TOML integers are i64.
            Kind::Integer => arg.value_parser(clap::value_parser!(i64).range(0..)),
            Kind::Number => arg.value_parser(clap::value_parser!(f64)),
            Kind::Text => arg,
            Kind::Choice(names) => arg.value_parser(names.clone()),
            Kind::List => arg.action(ArgAction::Append),
        }
    }

    fn value(&self, m: &ArgMatches) -> Option<toml::Value> {
        let id = self.name.as_str();
        Some(match &self.kind {
            Kind::Bool => toml::Value::Boolean(*m.get_one::<bool>(id)?),
            Kind::Integer => toml::Value::Integer(*m.get_one::<i64>(id)?),
            Kind::Number => toml::Value::Float(*m.get_one::<f64>(id)?),
            Kind::Text | Kind::Choice(_) => toml::Value::String(m.get_one::<String>(id)?.clone()),
            Kind::List => toml::Value::Array(
                m.get_many::<String>(id)?
                    .map(|s| toml::Value::String(s.clone()))
                    .collect(),
            ),
        })
    }
}

impl RemoteFlags {
    /// Puts the given keys over `remote` (made with its defaults when
    /// absent); the result is checked like the file's section.
    pub(super) fn apply(&self, remote: &mut Option<Box<RemoteConfig>>) -> Result<(), ConfigError> {
        if self.given.is_empty() {
            return Ok(());
        }
        let invalid = |message: String| ConfigError::Invalid {
            key: "remote".into(),
            message,
        };
        let r = remote.get_or_insert_with(Default::default);
        let mut table = toml::Table::try_from(&**r).map_err(|e| invalid(e.to_string()))?;
        for (key, value) in &self.given {
            table.insert(key.clone(), value.clone());
        }
        **r = table.try_into().map_err(|e| invalid(e.to_string()))?;
        Ok(())
    }

    /// The flags in `args` (the program name first), as `ctcached` parses
    /// them.
    pub fn parse_from<I, T>(args: I) -> Result<RemoteFlags, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{Args, FromArgMatches};
        let cmd = RemoteFlags::augment_args(Command::new("ctcached"));
        RemoteFlags::from_arg_matches(&cmd.try_get_matches_from(args)?)
    }
}

impl clap::FromArgMatches for RemoteFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let given = keys()
            .iter()
            .filter_map(|k| Some((k.name.clone(), k.value(m)?)))
            .collect();
        Ok(RemoteFlags { given })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for RemoteFlags {
    fn augment_args(cmd: Command) -> Command {
        keys()
            .iter()
            .fold(cmd.next_help_heading("Fleet tier ([remote])"), |cmd, k| {
                cmd.arg(k.arg())
            })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_has_a_flag_with_help() {
        let cmd = <RemoteFlags as clap::Args>::augment_args(Command::new("t"));
        let table = toml::Table::try_from(RemoteConfig {
            signing_key_file: Some("k".into()),
            ..Default::default()
        })
        .unwrap();
        for key in table.keys() {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id().as_str() == key)
                .unwrap_or_else(|| panic!("no flag for [remote] {key}"));
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(help.len() > 10, "{key}: {help:?}");
        }
        let timeout = cmd
            .get_arguments()
            .find(|a| a.get_id().as_str() == "timeout_ms")
            .unwrap();
        let help = timeout.get_help().unwrap().to_string();
        assert!(help.ends_with("(default: 3000)."), "{help}");
    }
}
