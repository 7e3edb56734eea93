//! Asking the `clusterset.local` DNS server as any client would: hickory-resolver, that
//! server only, no cache, no search list.

use std::net::{IpAddr, SocketAddr};

use hickory_resolver::Resolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;

/// An SRV record's port and target.
pub type Srv = (u16, String);

fn resolver(server: SocketAddr) -> Result<Resolver<TokioRuntimeProvider>, String> {
    let mut ns = NameServerConfig::udp_and_tcp(server.ip());
    for c in &mut ns.connections {
        c.port = server.port();
    }
    let mut opts = ResolverOpts::default();
    opts.cache_size = 0;
    Resolver::builder_with_config(
        ResolverConfig::from_parts(None, vec![], vec![ns]),
        TokioRuntimeProvider::default(),
    )
    .with_options(opts)
    .build()
    .map_err(|e| format!("DNS resolver for {server}: {e}"))
}

/// The A and AAAA answers for `name` (absolute), sorted. No records is an empty list.
pub async fn addresses(server: SocketAddr, name: &str) -> Result<Vec<IpAddr>, String> {
    let lookup = match resolver(server)?.lookup_ip(name).await {
        Ok(lookup) => lookup,
        Err(e) if e.is_no_records_found() => return Ok(Vec::new()),
        Err(e) => return Err(format!("A/AAAA {name} at {server}: {e}")),
    };
    let mut ips: Vec<IpAddr> = lookup.iter().collect();
    ips.sort();
    Ok(ips)
}

/// The SRV answers for `name` (absolute), sorted.
pub async fn srv(server: SocketAddr, name: &str) -> Result<Vec<Srv>, String> {
    let lookup = resolver(server)?
        .srv_lookup(name)
        .await
        .map_err(|e| format!("SRV {name} at {server}: {e}"))?;
    let mut records: Vec<Srv> = lookup
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(srv) => Some((srv.port, srv.target.to_string())),
            _ => None,
        })
        .collect();
    records.sort();
    Ok(records)
}
