//! The DNS resolver against a real DNS server on loopback (hickory-server with an in-memory
//! `clusterset.local` zone whose records the tests change), and through the layer to real
//! HTTP servers.

mod support;

use std::collections::HashSet;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hickory_proto::rr::rdata::{A, SOA, SRV};
use hickory_proto::rr::{LowerName, Name, RData, Record, RecordType, RrKey};
use hickory_server::Server;
use hickory_server::net::runtime::{Time, TokioRuntimeProvider};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneHandler, ZoneType};
use mcs_client::{DnsResolver, Error, McsLayer, Served};
use mcs_core::discovery::{Resolution, Resolve, Target, Update};
use mcs_core::endpoints::Locality;
use mcs_core::name::ServiceRef;
use tower::{ServiceBuilder, ServiceExt};

use support::*;

const PORT: u16 = 19444;

/// Counts SRV queries, then answers from the catalog.
struct Counting {
    catalog: Catalog,
    srv_queries: Arc<AtomicU64>,
}

// `RequestHandler` is an `async_trait`; this is its desugared form.
impl RequestHandler for Counting {
    fn handle_request<'a, 'b, 'r, R, T>(
        &'a self,
        request: &'b Request,
        response_handle: R,
    ) -> Pin<Box<dyn Future<Output = ResponseInfo> + Send + 'r>>
    where
        'a: 'r,
        'b: 'r,
        R: ResponseHandler + 'r,
        T: Time + 'r,
        Self: 'r,
    {
        if request
            .request_info()
            .is_ok_and(|info| info.query.query_type() == RecordType::SRV)
        {
            self.srv_queries.fetch_add(1, Ordering::SeqCst);
        }
        self.catalog
            .handle_request::<R, T>(request, response_handle)
    }
}

struct Dns {
    addr: SocketAddr,
    zone: Arc<InMemoryZoneHandler<TokioRuntimeProvider>>,
    srv_queries: Arc<AtomicU64>,
    serial: AtomicU64,
    _server: Server<Counting>,
}

fn name(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

impl Dns {
    async fn start(ip: [u8; 4]) -> Self {
        let origin = name("clusterset.local.");
        let mut zone = InMemoryZoneHandler::<TokioRuntimeProvider>::empty(
            origin.clone(),
            ZoneType::Primary,
            AxfrPolicy::Deny,
        );
        let soa = SOA::new(
            name("ns.clusterset.local."),
            name("hostmaster.clusterset.local."),
            1,
            60,
            60,
            600,
            1,
        );
        assert!(zone.upsert_mut(Record::from_rdata(origin.clone(), 1, RData::SOA(soa)), 1));
        let zone = Arc::new(zone);
        let mut catalog = Catalog::new();
        catalog.upsert(
            LowerName::new(&origin),
            vec![Arc::clone(&zone) as Arc<dyn ZoneHandler>],
        );
        let srv_queries = Arc::new(AtomicU64::new(0));
        let udp = tokio::net::UdpSocket::bind(SocketAddr::from((ip, 0)))
            .await
            .unwrap();
        let addr = udp.local_addr().unwrap();
        let tcp = tokio::net::TcpListener::bind(addr).await.unwrap();
        let mut server = Server::new(Counting {
            catalog,
            srv_queries: Arc::clone(&srv_queries),
        });
        server.register_socket(udp);
        server.register_listener(tcp, Duration::from_secs(5), 64);
        Self {
            addr,
            zone,
            srv_queries,
            serial: AtomicU64::new(2),
            _server: server,
        }
    }

    fn serial(&self) -> u32 {
        self.serial.fetch_add(1, Ordering::SeqCst) as u32
    }

    async fn clear(&self, owner: &str, rtype: RecordType) {
        self.zone
            .records_mut()
            .await
            .remove(&RrKey::new(LowerName::new(&name(owner)), rtype));
    }

    /// Replaces the SRV records at `owner`: `(target, port)` pairs, TTL 1 s.
    async fn set_srv(&self, owner: &str, targets: &[(&str, u16)]) {
        self.clear(owner, RecordType::SRV).await;
        for (target, port) in targets {
            let srv = SRV::new(0, 50, *port, name(target));
            assert!(
                self.zone
                    .upsert(
                        Record::from_rdata(name(owner), 1, RData::SRV(srv)),
                        self.serial()
                    )
                    .await
            );
        }
    }

    /// Replaces the A records at `owner`, TTL 1 s.
    async fn set_a(&self, owner: &str, ips: &[[u8; 4]]) {
        self.clear(owner, RecordType::A).await;
        for ip in ips {
            assert!(
                self.zone
                    .upsert(
                        Record::from_rdata(
                            name(owner),
                            1,
                            RData::A(A::from(std::net::Ipv4Addr::from(*ip)))
                        ),
                        self.serial()
                    )
                    .await
            );
        }
    }

    fn srv_queries(&self) -> u64 {
        self.srv_queries.load(Ordering::SeqCst)
    }
}

const SVC: &str = "loyalty-accrual.loyalty.svc.clusterset.local.";

/// Publishes a headless endpoint: SRV target `<dashed-ip>.<cluster>.<svc>` and its A record.
fn endpoint_name(ip: [u8; 4], cluster_name: &str) -> String {
    format!(
        "{}-{}-{}-{}.{cluster_name}.{SVC}",
        ip[0], ip[1], ip[2], ip[3]
    )
}

async fn publish(dns: &Dns, endpoints: &[([u8; 4], &str)]) {
    let names: Vec<String> = endpoints
        .iter()
        .map(|(ip, c)| endpoint_name(*ip, c))
        .collect();
    for ((ip, _), n) in endpoints.iter().zip(&names) {
        dns.set_a(n, &[*ip]).await;
    }
    let mut targets: Vec<(&str, u16)> = names.iter().map(|n| (n.as_str(), PORT)).collect();
    // A record for another service port, which must be ignored for PORT.
    targets.push((names[0].as_str(), PORT + 1));
    dns.set_srv(SVC, &targets).await;
}

fn resolver(dns: &Dns, min_ttl: Duration) -> DnsResolver {
    DnsResolver::builder()
        .name_server(dns.addr)
        .ttl_bounds(min_ttl, Duration::from_secs(2))
        .query_timeout(Duration::from_secs(1), 2)
        .build()
        .unwrap()
}

async fn next(resolution: &mut Resolution) -> Update {
    let item = tokio::time::timeout(
        Duration::from_secs(10),
        std::future::poll_fn(|cx| resolution.as_mut().poll_next(cx)),
    )
    .await
    .expect("an update within 10 s")
    .expect("the resolution does not end");
    item.expect("no resolve error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_srv_keeps_clusters_and_follows_ttl_changes() {
    let dns = Dns::start([127, 0, 8, 53]).await;
    let e1 = TestServer::start(IpAddr::from([127, 10, 8, 1]), PORT, "east").await;
    let e2 = TestServer::start(IpAddr::from([127, 10, 8, 2]), PORT, "east").await;
    let w1 = TestServer::start(IpAddr::from([127, 20, 8, 1]), PORT, "west").await;
    publish(
        &dns,
        &[
            ([127, 10, 8, 1], "east"),
            ([127, 10, 8, 2], "east"),
            ([127, 20, 8, 1], "west"),
        ],
    )
    .await;
    let dns_resolver = resolver(&dns, Duration::from_millis(200));

    // The resolution itself: endpoints carry the cluster and hostname from the SRV target.
    let mut resolution = dns_resolver.resolve(&target(PORT));
    let Update::Reset(endpoints) = next(&mut resolution).await else {
        panic!("expected a reset")
    };
    let got: HashSet<(SocketAddr, String, String)> = endpoints
        .iter()
        .map(|e| {
            (
                e.addr,
                e.cluster.to_string(),
                e.hostname.as_ref().unwrap().to_string(),
            )
        })
        .collect();
    let want: HashSet<(SocketAddr, String, String)> = [
        (e1.addr, "east".to_owned(), "127-10-8-1".to_owned()),
        (e2.addr, "east".to_owned(), "127-10-8-2".to_owned()),
        (w1.addr, "west".to_owned(), "127-20-8-1".to_owned()),
    ]
    .into();
    assert_eq!(got, want);
    drop(resolution);

    // Through the layer: the checkout client in east stays local.
    let layer = McsLayer::new(dns_resolver.clone(), Locality::cluster(cluster("east")));
    let svc = ServiceBuilder::new().layer(layer).service(http1());
    for _ in 0..50 {
        let response = svc.clone().oneshot(get(PORT, "/accrue")).await.unwrap();
        let served = response.extensions().get::<Served>().cloned().unwrap();
        let (c, addr, host) = answer(response).await;
        assert_eq!((c.as_str(), served.cluster().as_str()), ("east", "east"));
        assert_eq!(served.addr(), addr);
        assert_eq!(host, format!("{HOST}:{PORT}"));
    }

    // East is scaled to a new pod and the old ones go: the TTL (1 s) brings the change.
    let e3 = TestServer::start(IpAddr::from([127, 10, 8, 3]), PORT, "east").await;
    publish(
        &dns,
        &[([127, 10, 8, 3], "east"), ([127, 20, 8, 1], "west")],
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "traffic moves to the new east endpoint",
        || {
            let svc = svc.clone();
            async move {
                let response = svc.oneshot(get(PORT, "/accrue")).await.unwrap();
                response
                    .extensions()
                    .get::<Served>()
                    .is_some_and(|s| s.addr() == e3.addr)
            }
        },
    )
    .await;
    let before = (e1.served(), e2.served());
    for _ in 0..30 {
        let response = svc.clone().oneshot(get(PORT, "/accrue")).await.unwrap();
        assert_eq!(
            response.extensions().get::<Served>().unwrap().addr(),
            e3.addr
        );
    }
    assert_eq!(
        (e1.served(), e2.served()),
        before,
        "removed endpoints get no traffic"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_empty_answer_never_empties_the_set() {
    let dns = Dns::start([127, 0, 9, 53]).await;
    publish(
        &dns,
        &[([127, 10, 9, 1], "east"), ([127, 20, 9, 1], "west")],
    )
    .await;
    let dns_resolver = resolver(&dns, Duration::from_secs(1));
    let mut resolution = dns_resolver.resolve(&target(PORT));
    assert!(matches!(next(&mut resolution).await, Update::Reset(e) if e.len() == 2));

    // The records vanish for exactly one query, then come back (a flapping source).
    let srv_records: Vec<(String, u16)> = vec![
        (endpoint_name([127, 10, 9, 1], "east"), PORT),
        (endpoint_name([127, 20, 9, 1], "west"), PORT),
    ];
    let before = dns.srv_queries();
    dns.clear(SVC, RecordType::SRV).await;
    eventually(
        Duration::from_secs(5),
        "one query saw the empty answer",
        || async { dns.srv_queries() > before },
    )
    .await;
    let targets: Vec<(&str, u16)> = srv_records.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    dns.set_srv(SVC, &targets).await;
    // Every update in the next 3 s still has both endpoints.
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(item) = tokio::time::timeout_at(
        until,
        std::future::poll_fn(|cx| resolution.as_mut().poll_next(cx)),
    )
    .await
    {
        match item.unwrap().unwrap() {
            Update::Reset(e) => assert_eq!(e.len(), 2, "the set was emptied by one empty answer"),
            other => panic!("unexpected update {other:?}"),
        }
    }

    // Gone for good: the second empty answer in a row confirms it. (The endpoint names
    // still exist below the service name, so this is NODATA, an empty set, not NXDOMAIN.)
    let before = dns.srv_queries();
    dns.clear(SVC, RecordType::SRV).await;
    loop {
        match next(&mut resolution).await {
            Update::Reset(e) if e.len() == 2 => continue,
            Update::Reset(e) if e.is_empty() => break,
            other => panic!("unexpected update {other:?}"),
        }
    }
    assert!(
        dns.srv_queries() >= before + 2,
        "confirmed by a second query"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterset_ip_and_missing_services() {
    let dns = Dns::start([127, 0, 10, 53]).await;
    let vip = TestServer::start(IpAddr::from([127, 10, 10, 100]), PORT, "vip").await;
    // A ClusterSetIP service: SRV points at the service name, whose A record is the VIP.
    let vip_svc = "checkout.shop.svc.clusterset.local.";
    dns.set_a(vip_svc, &[[127, 10, 10, 100]]).await;
    dns.set_srv(vip_svc, &[(vip_svc, PORT)]).await;
    // A service with only an A record (unnamed port, no SRV).
    let plain_svc = "ledger.shop.svc.clusterset.local.";
    dns.set_a(plain_svc, &[[127, 10, 10, 100]]).await;
    let dns_resolver = resolver(&dns, Duration::from_millis(200));

    for svc_name in ["checkout", "ledger"] {
        let t = Target {
            service: ServiceRef::new("shop", svc_name).unwrap(),
            port: PORT,
        };
        let mut resolution = dns_resolver.resolve(&t);
        let Update::Reset(endpoints) = next(&mut resolution).await else {
            panic!("expected a reset")
        };
        assert_eq!(endpoints.len(), 1, "{svc_name}");
        assert_eq!(endpoints[0].addr, vip.addr);
        assert_eq!(
            endpoints[0].cluster.as_str(),
            "clusterset",
            "a VIP has no cluster of its own"
        );
    }

    let layer = McsLayer::new(dns_resolver.clone(), Locality::cluster(cluster("east")));
    let svc = ServiceBuilder::new().layer(layer).service(http1());
    let response = svc
        .clone()
        .oneshot(
            http::Request::get(format!("http://checkout.shop.svc.clusterset.local:{PORT}/"))
                .body(http_body_util::Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(answer(response).await.1, vip.addr);

    // No records at all: NXDOMAIN is DoesNotExist, a typed error at once.
    let err = svc
        .clone()
        .oneshot(
            http::Request::get(format!("http://missing.shop.svc.clusterset.local:{PORT}/"))
                .body(http_body_util::Full::default())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::DoesNotExist { service }) if service == "shop/missing:19444"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headless_port_without_srv_records_has_no_endpoints_until_published() {
    let dns = Dns::start([127, 0, 11, 53]).await;
    publish(
        &dns,
        &[([127, 10, 11, 1], "east"), ([127, 20, 11, 1], "west")],
    )
    .await;
    // The bare name's A records list every endpoint; a fallback to them would send port
    // PORT + 2 traffic to endpoints that do not serve it.
    dns.set_a(SVC, &[[127, 10, 11, 1], [127, 20, 11, 1]]).await;
    let dns_resolver = resolver(&dns, Duration::from_millis(200));
    let mut resolution = dns_resolver.resolve(&target(PORT + 2));
    assert!(
        matches!(next(&mut resolution).await, Update::Reset(e) if e.is_empty()),
        "no SRV record for the port: no endpoints"
    );
    // West starts serving the port: the next query (which skips the cache) finds it.
    let west = endpoint_name([127, 20, 11, 1], "west");
    let east = endpoint_name([127, 10, 11, 1], "east");
    dns.set_srv(SVC, &[(&east, PORT), (&west, PORT), (&west, PORT + 2)])
        .await;
    let endpoints = loop {
        match next(&mut resolution).await {
            Update::Reset(e) if !e.is_empty() => break e,
            _ => continue,
        }
    };
    assert_eq!(endpoints.len(), 1);
    assert_eq!(
        endpoints[0].addr,
        SocketAddr::from(([127, 20, 11, 1], PORT + 2))
    );
    assert_eq!(endpoints[0].cluster.as_str(), "west");
}
