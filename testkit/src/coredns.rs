//! CoreDNS as a real peer of `mcs-dns`: the binary `scripts/kwok-coredns-bins.sh` builds
//! ([`super::coredns_bin`]), started on a free loopback port with a Corefile the test
//! writes, killed and reaped when dropped.

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::RecordType;

use super::bins::coredns_bin;
use super::dns::dns_query_within;
use super::process::spawn;

/// How long CoreDNS may take to answer its first question (it lists what its plugins
/// watch first).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A loopback port free for both UDP and TCP right now (a DNS server binds both).
pub fn free_dns_port() -> u16 {
    loop {
        let udp = UdpSocket::bind("127.0.0.1:0").expect("bind UDP 127.0.0.1:0");
        let port = udp.local_addr().expect("local address").port();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A running CoreDNS; killed and reaped on drop, also when the test panics.
#[derive(Debug)]
pub struct CoreDns {
    child: Child,
    addr: SocketAddr,
    corefile: PathBuf,
    log: PathBuf,
}

impl CoreDns {
    /// Starts CoreDNS in `dir` with the Corefile `corefile(port)` returns for a free port
    /// (written to `dir/<name>.Corefile`, log in `dir/<name>.log`), and returns once
    /// `127.0.0.1:port` answers `probe` (a name and type) with NOERROR and records, so its
    /// plugins have synced. A port taken between choosing and binding it gets another
    /// try; CoreDNS exiting otherwise panics with its log.
    pub async fn start(
        dir: &Path,
        name: &str,
        corefile: impl Fn(u16) -> String,
        probe: (&str, RecordType),
    ) -> CoreDns {
        let bin = coredns_bin();
        let path = dir.join(format!("{name}.Corefile"));
        let log = dir.join(format!("{name}.log"));
        for attempt in 1..=3 {
            let port = free_dns_port();
            std::fs::write(&path, corefile(port))
                .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            let _ = std::fs::remove_file(&log);
            // Through setpriv --pdeathsig like the clusters' processes: it dies with the test.
            let args = ["-conf".to_owned(), path.display().to_string()];
            let child = spawn(&bin, &args, dir, &log)
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
            let mut server = CoreDns {
                child,
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                corefile: path.clone(),
                log: log.clone(),
            };
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                let answer =
                    dns_query_within(server.addr, probe.0, probe.1, Duration::from_secs(1)).await;
                if answer.is_some_and(|m| {
                    m.metadata.response_code == ResponseCode::NoError && !m.answers.is_empty()
                }) {
                    return server;
                }
                if let Some(status) = server.child.try_wait().expect("poll CoreDNS") {
                    let text = server.log_text();
                    assert!(
                        attempt < 3 && text.contains("address already in use"),
                        "CoreDNS exited ({status}) with Corefile\n{}\nlog:\n{text}",
                        server.corefile_text()
                    );
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "CoreDNS does not answer {} {} after {START_TIMEOUT:?}; Corefile\n{}\nlog:\n{}",
                    probe.0,
                    probe.1,
                    server.corefile_text(),
                    server.log_text()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Where it listens (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its process id (to read its resource use).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The Corefile it runs with.
    pub fn corefile_text(&self) -> String {
        std::fs::read_to_string(&self.corefile).unwrap_or_default()
    }
}

impl Drop for CoreDns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
