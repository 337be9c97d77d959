//! `ctcached`: the compiled-tensor cache daemon (gRPC service arrives with the store).
fn main() -> anyhow::Result<()> {
    anyhow::bail!("ctcached: the daemon is not built yet; use `ctcachectl` offline commands")
}
