//! A DNS resolver that asks only the server under test.

/// A hickory resolver that asks only `server` (UDP, then TCP on truncation), with no cache
/// and no search list: every lookup is a fresh question to the server under test.
pub fn dns_resolver(
    server: std::net::SocketAddr,
) -> hickory_resolver::Resolver<hickory_resolver::net::runtime::TokioRuntimeProvider> {
    use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
    let mut ns = NameServerConfig::udp_and_tcp(server.ip());
    for c in &mut ns.connections {
        c.port = server.port();
    }
    let mut opts = ResolverOpts::default();
    opts.cache_size = 0;
    opts.ndots = 0;
    hickory_resolver::Resolver::builder_with_config(
        ResolverConfig::from_parts(None, vec![], vec![ns]),
        hickory_resolver::net::runtime::TokioRuntimeProvider::default(),
    )
    .with_options(opts)
    .build()
    .expect("resolver")
}
