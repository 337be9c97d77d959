//! `ctcached`: parses flags, loads the config, starts logging, binds the
//! sockets and runs the daemon library until SIGTERM or SIGINT.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use ctcached::config::{config_file, Config, Overrides};
use ctcached::{logging, Listeners};

mod transport;

/// The compiled-tensor cache daemon.
#[derive(Debug, Parser)]
#[command(
    name = "ctcached",
    version,
    about,
    long_about = "The compiled-tensor cache daemon: packs ONNX initializers into device-specific \
                  layouts, stores them once per (source digest, device, physical type) and serves \
                  them over gRPC on a Unix socket. Flags override the CTCACHE_* environment, which \
                  overrides the config file (docs/operations/configure.md).",
    after_help = "Stops (draining open calls) on SIGTERM or SIGINT. `ctcachectl status` talks to it."
)]
struct Args {
    /// Config file (default: $CTCACHE_CONFIG, /etc/ctcache/ctcached.toml under systemd, ~/.config/ctcache/ctcached.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Every config key with a flag (`--cache-dir`, `--watch`, `--remote-url`, ...).
    #[command(flatten)]
    keys: Overrides,
    /// Print the effective config as TOML and exit.
    #[arg(long)]
    print_config: bool,
    /// Print the man page (roff) and exit (scripts/install.sh installs it).
    #[arg(long, hide = true)]
    print_man: bool,
}

fn main() -> std::process::ExitCode {
    match start(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ctcached: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn start(args: Args) -> Result<()> {
    if args.print_man {
        use clap::CommandFactory;
        use std::io::Write;
        let mut page = Vec::new();
        clap_mangen::Man::new(Args::command())
            .section("8")
            .render(&mut page)?;
        return match std::io::stdout().lock().write_all(&page) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
            _ => Ok(()),
        };
    }
    let env = |k: &str| std::env::var(k).ok();
    let file = config_file(args.config.as_deref(), &env);
    let config = Config::load(file.as_deref(), &env, &args.keys)?;
    if args.print_config {
        print!("{}", config.to_toml());
        return Ok(());
    }
    logging::init(config.log_format, &config.log_level);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(serve(config))
}

async fn serve(config: Config) -> Result<()> {
    // Signal handlers first: a SIGTERM right after the socket appears must
    // drain, not kill.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let shutdown = async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    };
    let env = |k: &str| std::env::var(k).ok();
    let group = transport::resolve_group(&config.socket_group)?;
    let mut spec = match transport::from_systemd(&env)? {
        Some(s) => s,
        None => transport::bind_unix(&config.socket, group)?,
    };
    // Beside a socket this process bound: removed again when it exits.
    let mut channel_path = None;
    let channel = match (spec.channel.take(), &spec.files.path) {
        (Some(fd), _) => Some(fd),
        (None, Some(p)) if !spec.files.activated => {
            let path = ctcache_api::handout::socket_path(p);
            let fd = transport::bind_channel(&path, group)?;
            channel_path = Some(path);
            Some(fd)
        }
        _ => None,
    };
    let tcp = match &config.listen_tcp {
        Some(a) => {
            Some(std::net::TcpListener::bind(a).with_context(|| format!("listening on {a}"))?)
        }
        None => None,
    };
    let socket_path = spec
        .files
        .path
        .clone()
        .or_else(|| Some(config.socket.clone()));
    let listeners = Listeners {
        unix: spec.listener,
        socket_path,
        tcp,
        handouts: channel,
    };
    let served = ctcached::run(config, listeners, shutdown).await;
    // First, so that a failed start finds the folders it made empty.
    if let Some(p) = channel_path {
        let _ = std::fs::remove_file(p);
    }
    spec.files.remove(served.is_err());
    Ok(served?)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn every_option_has_help() {
        let cmd = super::Args::command();
        cmd.clone().debug_assert();
        let missing: Vec<String> = cmd
            .get_arguments()
            .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
            .filter(|a| a.get_help().is_none_or(|h| h.to_string().trim().is_empty()))
            .map(|a| a.get_id().to_string())
            .collect();
        assert!(missing.is_empty(), "options without help: {missing:?}");
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd)
            .section("8")
            .render(&mut page)
            .unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(page.contains(".TH ctcached 8"), "{page}");
        assert!(page.contains("cache\\-dir"), "{page}");
    }

    #[test]
    fn remote_flags_reach_the_config() {
        use ctcache_remote::config::FetchMode;
        use ctcached::config::Config;
        let args = <super::Args as clap::Parser>::try_parse_from([
            "ctcached",
            "--remote-url",
            "s3://b-1/p",
            "--remote-read",
            "false",
            "--remote-fetch",
            "never",
            "--remote-trusted-key",
            "a:x",
            "--remote-trusted-key",
            "b:y",
            "--remote-audit-rate",
            "0.5",
        ])
        .unwrap();
        let c = Config::load(None, &|_| None, &args.keys).unwrap();
        let r = c.remote.unwrap();
        assert_eq!(r.url, "s3://b-1/p");
        assert_eq!((r.read, r.fetch), (false, FetchMode::Never));
        assert_eq!(r.trusted_keys, ["a:x", "b:y"]);
        assert_eq!(r.audit_rate, 0.5);
        assert!(r.write, "a key without its flag keeps its default");
        let bad = <super::Args as clap::Parser>::try_parse_from([
            "ctcached",
            "--remote-fetch",
            "sometimes",
        ]);
        assert!(bad.is_err());
    }
}
