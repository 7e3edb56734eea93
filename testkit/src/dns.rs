//! DNS clients for tests: a resolver that asks only the server under test, and raw
//! questions whose whole answer a test can compare.

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

/// One question to `server` over UDP with EDNS (payload 1232, so nothing here truncates),
/// recursion desired, as a stub resolver or a forwarder sends it; waits up to 10 s.
/// The raw answer comes back (response code, every section), so tests compare servers
/// without a resolver's interpretation in between.
pub async fn dns_query(
    server: std::net::SocketAddr,
    name: &str,
    qtype: hickory_resolver::proto::rr::RecordType,
) -> hickory_resolver::proto::op::Message {
    dns_query_within(server, name, qtype, std::time::Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("no answer from {server} to {name} {qtype}"))
}

/// [`dns_query`], giving up after `timeout` (`None`: no answer in time).
pub async fn dns_query_within(
    server: std::net::SocketAddr,
    name: &str,
    qtype: hickory_resolver::proto::rr::RecordType,
    timeout: std::time::Duration,
) -> Option<hickory_resolver::proto::op::Message> {
    use hickory_resolver::proto::op::{Edns, Message, MessageType, OpCode, Query};
    use hickory_resolver::proto::rr::Name;
    let id: u16 = rand_id();
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(
        Name::from_ascii(name).unwrap_or_else(|e| panic!("query name {name:?}: {e}")),
        qtype,
    ));
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    m.set_edns(edns);
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind a UDP socket");
    sock.send_to(&m.to_vec().expect("encode the query"), server)
        .await
        .unwrap_or_else(|e| panic!("send to {server}: {e}"));
    let mut buf = vec![0u8; 65535];
    let receive = async {
        loop {
            let (n, _) = sock
                .recv_from(&mut buf)
                .await
                .unwrap_or_else(|e| panic!("receive from {server}: {e}"));
            if n >= 2 && buf[..2] == id.to_be_bytes() {
                return Message::from_vec(&buf[..n])
                    .unwrap_or_else(|e| panic!("answer from {server} to {name} {qtype}: {e}"));
            }
        }
    };
    tokio::time::timeout(timeout, receive).await.ok()
}

/// A query id that differs between calls.
fn rand_id() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0x0c0d);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The addresses (A and AAAA data) of the answer section of `m`, sorted.
pub fn answer_addresses(m: &hickory_resolver::proto::op::Message) -> Vec<std::net::IpAddr> {
    use hickory_resolver::proto::rr::RData;
    let mut out: Vec<std::net::IpAddr> = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(std::net::IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(std::net::IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    out.sort();
    out
}
