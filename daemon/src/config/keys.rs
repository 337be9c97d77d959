//! The keys of the config as the environment and the flags give them,
//! read from the config's own declaration: each field of [`Config`] and
//! [`RemoteConfig`] is a key, its doc comment the flag's help, its type the
//! way a value is read, its default the one the help shows. A field says
//! which forms it has besides the file (`#[schemars(extend("x-env" =
//! "CTCACHE_X", "x-flag" = true))]`); every `[remote]` key has a flag
//! `--remote-KEY`. Nothing else spells a key.

use clap::{Arg, ArgAction, ArgMatches, Command};
use ctcache_remote::config::RemoteConfig;
use serde_json::Value as Json;

use super::{Config, ConfigError};

/// A key's value from the environment or a flag: set, or (`None`) unset
/// (an optional key given as empty).
type Given = (Vec<String>, Option<toml::Value>);

/// One config key and its forms.
pub(super) struct Key {
    /// `["workers"]`, `["remote", "url"]`.
    path: Vec<String>,
    kind: Kind,
    /// The key may be absent (`Option`): an empty value unsets it.
    optional: bool,
    doc: String,
    /// The default, as the help shows it (none when empty).
    default: Option<String>,
    env: Option<String>,
    flag: bool,
}

/// How a value is read, from the key's type.
enum Kind {
    Bool,
    Integer,
    Number,
    Text,
    Choice(Vec<String>),
    /// A list of text: a repeatable flag named in the singular; from the
    /// environment, `:`-separated.
    List,
}

/// Every key with a form besides the file, top-level keys first.
pub(super) fn keys() -> Vec<Key> {
    let config = schemars::schema_for!(Config);
    let remote = schemars::schema_for!(RemoteConfig);
    let mut keys = section(config.as_value(), &[], false);
    keys.extend(section(remote.as_value(), &["remote"], true));
    keys.retain(|k| k.env.is_some() || k.flag);
    keys
}

/// The keys of one section's schema; `all_flags`: each has a flag.
fn section(root: &Json, prefix: &[&str], all_flags: bool) -> Vec<Key> {
    let Some(props) = root.get("properties").and_then(Json::as_object) else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(name, prop)| {
            let resolved = resolve(root, prop);
            Key {
                path: prefix
                    .iter()
                    .map(|p| p.to_string())
                    .chain([name.clone()])
                    .collect(),
                kind: kind(resolved),
                optional: types(resolved).contains(&"null"),
                doc: doc(prop),
                default: default(prop),
                env: prop.get("x-env").and_then(Json::as_str).map(String::from),
                flag: all_flags || prop.get("x-flag").and_then(Json::as_bool) == Some(true),
            }
        })
        .collect()
}

/// `prop` with a `$ref` to a definition followed.
fn resolve<'a>(root: &'a Json, prop: &'a Json) -> &'a Json {
    prop.get("$ref")
        .and_then(Json::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|name| root.get("$defs")?.get(name))
        .unwrap_or(prop)
}

/// The JSON types a value may have (an optional key's include `null`).
fn types(schema: &Json) -> Vec<&str> {
    match schema.get("type") {
        Some(Json::String(t)) => vec![t.as_str()],
        Some(Json::Array(ts)) => ts.iter().filter_map(Json::as_str).collect(),
        _ => Vec::new(),
    }
}

fn kind(schema: &Json) -> Kind {
    if let Some(choices) = choices(schema) {
        return Kind::Choice(choices);
    }
    match types(schema).iter().find(|t| **t != "null") {
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
    match (schema.get("enum"), schema.get("oneOf")) {
        (Some(Json::Array(vs)), _) | (None, Some(Json::Array(vs))) => Some(names(vs)),
        _ => None,
    }
}

/// The doc comment on one line, without its final period.
fn doc(prop: &Json) -> String {
    let doc = prop.get("description").and_then(Json::as_str).unwrap_or("");
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    doc.trim_end_matches('.').to_string()
}

fn default(prop: &Json) -> Option<String> {
    match prop.get("default")? {
        Json::Null => None,
        Json::String(s) if s.is_empty() => None,
        Json::Array(a) if a.is_empty() => None,
        Json::String(s) => Some(s.clone()),
        v => Some(v.to_string()),
    }
}

/// The names of a choice, as "a, b or c".
fn one_of(names: &[String]) -> String {
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

impl Key {
    /// The key's dotted name (`remote.url`): its flag's argument id.
    fn id(&self) -> String {
        self.path.join(".")
    }

    fn long(&self) -> String {
        let long = self.path.join("-").replace('_', "-");
        match self.kind {
            Kind::List => long.strip_suffix('s').unwrap_or(&long).to_string(),
            _ => long,
        }
    }

    fn help(&self) -> String {
        let mut notes = Vec::new();
        if let Some(d) = &self.default {
            notes.push(format!("default: {d}"));
        }
        if let Some(v) = &self.env {
            notes.push(format!("env {v}"));
        }
        if let Kind::List = self.kind {
            notes.push("repeatable; replaces the list".into());
        }
        match notes.is_empty() {
            true => format!("{}.", self.doc),
            false => format!("{} ({}).", self.doc, notes.join("; ")),
        }
    }

    fn arg(&self) -> Arg {
        let long = self.long();
        let arg = Arg::new(self.id())
            .long(long.clone())
            .value_name(long.replace('-', "_").to_uppercase())
            .help(self.help());
        let arg = match self.path.first().map(String::as_str) {
            Some("remote") => arg.help_heading("Fleet tier ([remote])"),
            _ => arg,
        };
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

    /// The flag's value, if given.
    fn flag_value(&self, m: &ArgMatches) -> Option<toml::Value> {
        let id = self.id();
        Some(match &self.kind {
            Kind::Bool => toml::Value::Boolean(*m.get_one::<bool>(&id)?),
            Kind::Integer => toml::Value::Integer(*m.get_one::<i64>(&id)?),
            Kind::Number => toml::Value::Float(*m.get_one::<f64>(&id)?),
            Kind::Text | Kind::Choice(_) => toml::Value::String(m.get_one::<String>(&id)?.clone()),
            Kind::List => toml::Value::Array(
                m.get_many::<String>(&id)?
                    .map(|s| toml::Value::String(s.clone()))
                    .collect(),
            ),
        })
    }

    /// The variable's value, read by the key's type: a flag word for a
    /// bool (`1`, `true`, `yes`, `on`; anything else is false), `:`-separated
    /// for a list; empty unsets an optional key and leaves a key of an
    /// absent section alone.
    fn env_value(&self, var: &str, v: String) -> Result<Option<Option<toml::Value>>, ConfigError> {
        let bad = |message: String| ConfigError::Env {
            var: var.to_string(),
            message,
        };
        if v.is_empty() && self.optional {
            return Ok(Some(None));
        }
        if v.is_empty() && self.path.len() > 1 {
            return Ok(None);
        }
        let value = match &self.kind {
            Kind::Bool => toml::Value::Boolean(matches!(v.as_str(), "1" | "true" | "yes" | "on")),
            Kind::Integer => toml::Value::Integer(
                v.parse::<i64>()
                    .ok()
                    .filter(|n| *n >= 0)
                    .ok_or_else(|| bad(format!("{v:?} is not a number")))?,
            ),
            Kind::Number => toml::Value::Float(
                v.parse()
                    .map_err(|_| bad(format!("{v:?} is not a number")))?,
            ),
            Kind::Choice(names) if !names.contains(&v) => {
                return Err(bad(format!("{v:?}: expected {}", one_of(names))));
            }
            Kind::Text | Kind::Choice(_) => toml::Value::String(v),
            Kind::List => toml::Value::Array(
                std::env::split_paths(&v)
                    .map(|p| toml::Value::String(p.display().to_string()))
                    .collect(),
            ),
        };
        Ok(Some(Some(value)))
    }
}

/// The keys the `CTCACHE_*` environment sets.
pub(super) fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<Given>, ConfigError> {
    let mut given = Vec::new();
    for key in keys() {
        let Some(var) = &key.env else { continue };
        let Some(v) = env(var) else { continue };
        if let Some(value) = key.env_value(var, v)? {
            given.push((key.path.clone(), value));
        }
    }
    Ok(given)
}

/// Puts `given` over `config` (a key of an absent section makes the
/// section with its defaults); the result is read back as the file's keys
/// are, and errors name the key.
pub(super) fn apply(config: &mut Config, given: &[Given]) -> Result<(), ConfigError> {
    if given.is_empty() {
        return Ok(());
    }
    let invalid = |key: String, message: String| ConfigError::Invalid { key, message };
    let mut table =
        toml::Table::try_from(&*config).map_err(|e| invalid("config".into(), e.to_string()))?;
    for (path, value) in given {
        let Some((last, sections)) = path.split_last() else {
            continue;
        };
        let mut at = &mut table;
        for s in sections {
            let entry = at
                .entry(s.clone())
                .or_insert_with(|| toml::Value::Table(Default::default()));
            at = entry
                .as_table_mut()
                .ok_or_else(|| invalid(s.clone(), "is not a section".into()))?;
        }
        match value {
            Some(v) => at.insert(last.clone(), v.clone()),
            None => at.remove(last),
        };
    }
    *config = table
        .try_into()
        .map_err(|e: toml::de::Error| invalid(path_names(given), e.to_string()))?;
    Ok(())
}

fn path_names(given: &[Given]) -> String {
    given
        .iter()
        .map(|(p, _)| p.join("."))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The flags given on the command line: each replaces its key (a list
/// flag the whole list), over the file and the environment.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Overrides {
    given: Vec<Given>,
}

impl Overrides {
    /// The flags in `args` (the program name first), as `ctcached` parses
    /// them.
    pub fn parse_from<I, T>(args: I) -> Result<Overrides, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{Args, FromArgMatches};
        let cmd = Overrides::augment_args(Command::new("ctcached"));
        Overrides::from_arg_matches(&cmd.try_get_matches_from(args)?)
    }

    pub(super) fn given(&self) -> &[Given] {
        &self.given
    }
}

impl clap::FromArgMatches for Overrides {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let given = keys()
            .iter()
            .filter(|k| k.flag)
            .filter_map(|k| Some((k.path.clone(), Some(k.flag_value(m)?))))
            .collect();
        Ok(Overrides { given })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for Overrides {
    fn augment_args(cmd: Command) -> Command {
        keys()
            .iter()
            .filter(|k| k.flag)
            .fold(cmd, |cmd, k| cmd.arg(k.arg()))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg<'a>(cmd: &'a Command, id: &str) -> &'a Arg {
        cmd.get_arguments()
            .find(|a| a.get_id().as_str() == id)
            .unwrap_or_else(|| panic!("no flag for {id}"))
    }

    #[test]
    fn every_remote_key_has_a_flag_with_help() {
        let cmd = <Overrides as clap::Args>::augment_args(Command::new("t"));
        let table = toml::Table::try_from(RemoteConfig {
            signing_key_file: Some("k".into()),
            ..Default::default()
        })
        .unwrap();
        for key in table.keys() {
            let help = arg(&cmd, &format!("remote.{key}"))
                .get_help()
                .unwrap()
                .to_string();
            assert!(help.len() > 10, "{key}: {help:?}");
        }
        let help = arg(&cmd, "remote.timeout_ms")
            .get_help()
            .unwrap()
            .to_string();
        assert!(help.ends_with("(default: 3000)."), "{help}");
        let help = arg(&cmd, "workers").get_help().unwrap().to_string();
        assert!(
            help.ends_with("(default: 0; env CTCACHE_WORKERS)."),
            "{help}"
        );
        assert_eq!(arg(&cmd, "watch").get_long(), Some("watch"));
        assert_eq!(
            arg(&cmd, "remote.trusted_keys").get_long(),
            Some("remote-trusted-key")
        );
    }
}
