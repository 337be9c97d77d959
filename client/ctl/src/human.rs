//! Human formatting: sizes (KiB/MiB/GiB), durations (ms/s), ages, keys,
//! colours, aligned tables; and the parsers for `--max-size`/`--max-age`.

use std::io::Write;

use crate::output::Failure;

const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];

/// Bytes in binary units: `512 B`, `1.5 KiB`, `12.0 MiB`.
pub fn size(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// A short duration: `850 µs`, `12.3 ms`, `4.56 s`, `3m 12s`.
pub fn duration_us(us: u64) -> String {
    match us {
        0..=999 => format!("{us} µs"),
        1_000..=999_999 => format!("{:.1} ms", us as f64 / 1e3),
        1_000_000..=59_999_999 => format!("{:.2} s", us as f64 / 1e6),
        _ => long_duration(us / 1_000_000),
    }
}

/// A long duration in seconds: `45 s`, `3m 12s`, `2h 05m`, `3d 4h`.
pub fn long_duration(s: u64) -> String {
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// How long ago a unix-ms time was: `12 s ago`, `3d 4h ago`.
pub fn age(unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return "-".into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    format!(
        "{} ago",
        long_duration(((now - unix_ms).max(0) / 1000) as u64)
    )
}

/// Time of day (UTC) of a unix-ms time, for event lines: `14:03:07.120Z`.
pub fn clock(unix_ms: i64) -> String {
    let ms = unix_ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}Z",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// A key short enough for a table; `--full` shows whole keys. Prefix and
/// suffix: the prefix is the source digest, the suffix the type key.
pub fn short_key(key: &str) -> String {
    if key.len() <= 28 {
        return key.to_string();
    }
    format!("{}…{}", &key[..14], &key[key.len() - 12..])
}

/// An argument value that does not parse; clap shows it as the usage error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadValue(pub String);

impl std::fmt::Display for BadValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadValue {}

/// Parses a size: a number with an optional unit. `K M G T` and `KiB MiB
/// GiB TiB` are powers of 1024, `KB MB GB TB` powers of 1000, `B` or no unit
/// bytes. `10G`, `512MiB`, `1.5GB`, `0`.
pub fn parse_size(s: &str) -> Result<u64, BadValue> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| BadValue(format!("{s:?} is not a size (e.g. 10G, 512MiB, 0)")))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(BadValue(format!(
                "unknown size unit {other:?} in {s:?} (use B, K, M, G, T, KiB.., KB..)"
            )))
        }
    };
    Ok((n * mult).round() as u64)
}

/// Parses a duration: number-unit pairs, `s m h d w`; a bare number is
/// seconds. `7d`, `12h`, `1d12h`, `90m`, `3600`.
pub fn parse_duration(s: &str) -> Result<u64, BadValue> {
    let bad = || BadValue(format!("{s:?} is not a duration (e.g. 7d, 12h, 30m, 45s)"));
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    let (mut total, mut num) = (0u64, String::new());
    for c in t.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 7 * 86_400,
            _ => return Err(bad()),
        };
        let n: u64 = num.parse().map_err(|_| bad())?;
        total = total.saturating_add(n.saturating_mul(unit));
        num.clear();
    }
    if !num.is_empty() {
        return Err(bad());
    }
    Ok(total)
}

/// `k=v` packer parameters, checked at parse time (a usage error).
pub fn parse_param(s: &str) -> Result<String, BadValue> {
    match s.split_once('=') {
        Some((k, _)) if !k.trim().is_empty() => Ok(s.to_string()),
        _ => Err(BadValue(format!("{s:?} is not k=v"))),
    }
}

/// Text styles; applied only when colour is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Plain,
    Bold,
    Dim,
    Green,
    Yellow,
    Red,
}

pub fn paint(s: &str, style: Style, color: bool) -> String {
    if !color || s.is_empty() {
        return s.to_string();
    }
    let code = match style {
        Style::Plain => return s.to_string(),
        Style::Bold => "1",
        Style::Dim => "2",
        Style::Green => "32",
        Style::Yellow => "33",
        Style::Red => "31",
    };
    format!("\x1b[{code}m{s}\x1b[0m")
}

/// `1 entry`, `2 entries`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// An aligned table whose cells may be coloured (padding is computed on the
/// plain text, so colour codes do not break the alignment).
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<(String, Style)>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<(String, Style)>) {
        self.rows.push(cells);
    }

    pub fn plain(&mut self, cells: Vec<String>) {
        self.rows
            .push(cells.into_iter().map(|c| (c, Style::Plain)).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn print(&self, color: bool) -> Result<(), Failure> {
        self.print_rows(color, true)
    }

    /// The rows only: key/value listings whose header would say nothing.
    pub fn print_body(&self, color: bool) -> Result<(), Failure> {
        self.print_rows(color, false)
    }

    fn print_rows(&self, color: bool, header: bool) -> Result<(), Failure> {
        let mut widths: Vec<usize> = self
            .header
            .iter()
            .map(|h| if header { h.chars().count() } else { 0 })
            .collect();
        for r in &self.rows {
            for (w, (c, _)) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: Vec<(&str, Style)>| -> String {
            let n = cells.len();
            let mut s = String::new();
            for (i, (c, style)) in cells.into_iter().enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                s.push_str(&paint(c, style, color));
                if i + 1 < n {
                    let w = widths.get(i).copied().unwrap_or(0);
                    s.push_str(&" ".repeat(w.saturating_sub(c.chars().count())));
                }
            }
            // An empty last column must not leave trailing blanks.
            s.trim_end().to_string()
        };
        let mut out = std::io::stdout().lock();
        if header {
            writeln!(
                out,
                "{}",
                line(
                    self.header
                        .iter()
                        .map(|h| (h.as_str(), Style::Bold))
                        .collect()
                )
            )?;
        }
        for r in &self.rows {
            writeln!(
                out,
                "{}",
                line(r.iter().map(|(c, s)| (c.as_str(), *s)).collect())
            )?;
        }
        Ok(())
    }
}

/// `s` as one shell word: as it is when only safe characters, else single-quoted.
pub fn shell_word(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(12 << 20), "12.0 MiB");
        assert_eq!(size(3 << 30), "3.0 GiB");
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5 GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("G").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("7d"), Ok(7 * 86_400));
        assert_eq!(parse_duration("12h"), Ok(12 * 3600));
        assert_eq!(parse_duration("1d12h"), Ok(36 * 3600));
        assert_eq!(parse_duration("90"), Ok(90));
        assert!(parse_duration("7x").is_err());
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("12h3").is_err());
        assert_eq!(duration_us(850), "850 µs");
        assert_eq!(duration_us(12_300), "12.3 ms");
        assert_eq!(duration_us(4_560_000), "4.56 s");
        assert_eq!(long_duration(192), "3m 12s");
        assert_eq!(long_duration(3 * 86_400 + 4 * 3600), "3d 4h");
        assert_eq!(clock(3_600_000 + 61_001), "01:01:01.001Z");
    }

    #[test]
    fn keys_and_paint() {
        let k = "a".repeat(194);
        assert_eq!(short_key(&k).chars().count(), 27);
        assert_eq!(paint("x", Style::Red, false), "x");
        assert_eq!(paint("x", Style::Red, true), "\x1b[31mx\x1b[0m");
        assert_eq!(parse_param("bits=4"), Ok("bits=4".into()));
        assert!(parse_param("bits").is_err());
    }
}
