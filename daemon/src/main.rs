//! `ctcached`: parses flags, loads the config, starts logging, binds the
//! sockets and runs the daemon library until SIGTERM or SIGINT.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use ctcached::config::{config_file, Config, LogFormat, Overrides};
use ctcached::{logging, Listeners};

mod transport;

/// The compiled-tensor cache daemon.
#[derive(Debug, Parser)]
#[command(name = "ctcached", version, about)]
struct Args {
    /// Config file (default: $CTCACHE_CONFIG, /etc/ctcache/ctcached.toml under systemd, ~/.config/ctcache/ctcached.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Model folder to watch (repeatable).
    #[arg(long)]
    watch: Vec<PathBuf>,
    /// Also listen on TCP (off by default).
    #[arg(long)]
    listen_tcp: Option<String>,
    /// Prometheus endpoint (off by default), e.g. 127.0.0.1:9464.
    #[arg(long)]
    metrics_addr: Option<String>,
    #[arg(long)]
    workers: Option<usize>,
    #[arg(long, value_parser = ["auto", "human", "json", "journald"])]
    log_format: Option<String>,
    /// Print the effective config as TOML and exit.
    #[arg(long)]
    print_config: bool,
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
    let env = |k: &str| std::env::var(k).ok();
    let flags = Overrides {
        cache_dir: args.cache_dir,
        socket: args.socket,
        watch: args.watch,
        listen_tcp: args.listen_tcp,
        metrics_addr: args.metrics_addr,
        workers: args.workers,
        log_format: args.log_format.map(|f| match f.as_str() {
            "human" => LogFormat::Human,
            "json" => LogFormat::Json,
            "journald" => LogFormat::Journald,
            _ => LogFormat::Auto,
        }),
    };
    let file = config_file(args.config.as_deref(), &env);
    let config = Config::load(file.as_deref(), &env, &flags)?;
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
    let spec = match transport::from_systemd(&env)? {
        Some(s) => s,
        None => transport::bind_unix(
            &config.socket,
            transport::resolve_group(&config.socket_group)?,
        )?,
    };
    let tcp = match &config.listen_tcp {
        Some(a) => {
            Some(std::net::TcpListener::bind(a).with_context(|| format!("listening on {a}"))?)
        }
        None => None,
    };
    let socket_path = spec.path.clone().or_else(|| Some(config.socket.clone()));
    let listeners = Listeners {
        unix: spec.listener,
        socket_path: socket_path.clone(),
        tcp,
    };
    let served = ctcached::run(config, listeners, shutdown).await;
    if let (Some(p), false) = (socket_path, spec.activated) {
        let _ = std::fs::remove_file(p);
    }
    Ok(served?)
}
